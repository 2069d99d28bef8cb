/**
 * scripts/build-agent.mjs: the agent bundle, its V8 start-up snapshot and the node flags init
 * runs it with. The snapshot is built and loaded by this node (the guest image carries the same
 * binary, stripped); a blob only loads with the flags that built it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-agent-build-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('build-agent.mjs --snapshot-blob', () => {
  it('writes the bundle, the flags and a blob that this node loads with those flags only', () => {
    const out = path.join(dir, 'agent.mjs');
    const blob = path.join(dir, 'agent.blob');
    const flagsFile = path.join(dir, 'agent.flags');
    execFileSync(
      process.execPath,
      [path.join(repo, 'scripts/build-agent.mjs'), '--out', out, '--snapshot-blob', blob, '--flags-out', flagsFile],
      {
        stdio: ['ignore', 'ignore', 'inherit'],
      },
    );
    expect(statSync(out).size).toBeGreaterThan(100_000);
    const flags = readFileSync(flagsFile, 'utf8').trim().split(' ');
    expect(flags.slice(0, 2)).toEqual(['--max-old-space-size=96', '--max-semi-space-size=1']);
    if (process.arch === 'x64') {
      // The snapshot's version tag hashes the CPU features V8 uses: with these flags it uses none,
      // so a blob built on this host loads on any x86-64 vCPU (TCG's, an older host's).
      const features = execFileSync(process.execPath, [...flags, '--v8-options'], { encoding: 'utf8' }).match(/SSE3=\d.*$/m)?.[0];
      expect(features).toMatch(/^SSE3=0 /);
      expect(features?.split(' ').filter((f) => !f.endsWith('=0'))).toEqual([]);
      // Without them, this host's node reports some feature in use (else the test proves nothing).
      const bare = execFileSync(process.execPath, ['--v8-options'], { encoding: 'utf8' }).match(/SSE3=\d.*$/m)?.[0];
      expect(bare?.split(' ').some((f) => f.endsWith('=1'))).toBe(true);
    }

    // The deserialized main answers the check and exits, without starting the agent.
    const ok = spawnSync(process.execPath, [...flags, '--snapshot-blob', blob], {
      env: { ...process.env, KATA_TS_AGENT_SNAPSHOT_CHECK: '1' },
      encoding: 'utf8',
    });
    expect(ok.stdout).toBe('kata-ts-agent snapshot ok\n');
    expect(ok.status).toBe(0);

    // Other V8 flags: node refuses the blob (what the build's own check guards against).
    const other = spawnSync(process.execPath, ['--max-old-space-size=512', '--snapshot-blob', blob], {
      env: { ...process.env, KATA_TS_AGENT_SNAPSHOT_CHECK: '1' },
      encoding: 'utf8',
    });
    expect(other.status).not.toBe(0);
    expect(other.stderr).toMatch(/different V8 configurations|startup snapshot/);
  }, 120_000);

  it('writes the entry script a guest builds the blob from, with no dynamic import() (code from a snapshot has none)', () => {
    const script = path.join(dir, 'agent-snapshot.cjs');
    execFileSync(
      process.execPath,
      [path.join(repo, 'scripts/build-agent.mjs'), '--out', path.join(dir, 'b.mjs'), '--snapshot-script', script],
      {
        stdio: ['ignore', 'ignore', 'inherit'],
      },
    );
    const text = readFileSync(script, 'utf8');
    expect(text).toContain('setDeserializeMainFunction');
    // node answers an import() in deserialized code with "A dynamic import callback was not
    // specified": the attester's lazy node:https once failed so, in every pod with secrets.
    expect(text.match(/(?<![\w$.])import\(/g) ?? []).toEqual([]);
  }, 120_000);
});
