/**
 * `kata-ts tpm-ca` on temporary dirs (real openssl): init creates and then keeps, show prints the
 * bundle (one certificate, two after a rotation), --json describes it, a missing CA is a coded
 * error, a bad command a usage error, and --dir (else the config's hypervisor.tpm.caDir) picks the dir.
 */
import { X509Certificate } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { UsageError } from '../../../src/cli/args.js';
import { runTpmCaCommand } from '../../../src/cli/tpm-ca.js';

function sink(): { stream: Writable; text: () => string } {
  const chunks: Buffer[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      chunks.push(Buffer.from(chunk));
      done();
    },
  });
  return { stream, text: () => Buffer.concat(chunks).toString('utf8') };
}

async function tpmCa(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = sink();
  const err = sink();
  const code = await runTpmCaCommand(argv, { stdout: out.stream, stderr: err.stream });
  return { code, stdout: out.text(), stderr: err.text() };
}

const certsIn = (pem: string) => pem.match(/-----BEGIN CERTIFICATE-----/g)?.length ?? 0;

describe('kata-ts tpm-ca', () => {
  let tmp: string;
  beforeEach(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-tpm-ca-cli-'));
  });
  afterEach(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('init creates, init again keeps; show prints the bundle; rotate adds the new CA in front', async () => {
    const dir = path.join(tmp, 'ca');
    const made = await tpmCa('init', '--dir', dir);
    expect([made.code, made.stdout]).toEqual([0, `created the node's TPM EK CA in ${dir} (generation 1)\n`]);
    expect((await tpmCa('init', '--dir', dir)).stdout).toContain('kept');
    const first = await tpmCa('show', '--dir', dir);
    expect(certsIn(first.stdout)).toBe(1);
    const rotated = await tpmCa('rotate', '--dir', dir);
    expect(rotated.stdout).toBe("generation 2 signs new pods' EK certificates; generation 1 stays in the bundle\n");
    const second = await tpmCa('show', '--dir', dir);
    expect(certsIn(second.stdout)).toBe(2);
    expect(second.stdout.endsWith(first.stdout)).toBe(true);
    const json = JSON.parse((await tpmCa('show', '--dir', dir, '--json')).stdout) as {
      current: { generation: number; fingerprintSha256: string };
      previous: { generation: number; fingerprintSha256: string };
    };
    expect([json.current.generation, json.previous.generation]).toEqual([2, 1]);
    expect(json.previous.fingerprintSha256).toBe(new X509Certificate(first.stdout).fingerprint256);
    expect((await tpmCa('rotate', '--dir', dir)).stdout).toContain('generation 1 was dropped');
  });

  it('show before init exits 1 with the reason and how to make one', async () => {
    const r = await tpmCa('show', '--dir', path.join(tmp, 'none'));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^kata-ts tpm-ca show: TPM_CA_MISSING: .*kata-ts tpm-ca init/);
  });

  it("takes the dir from the config's hypervisor.tpm.caDir when --dir is absent", async () => {
    const dir = path.join(tmp, 'from-config');
    const config = path.join(tmp, 'config.json');
    await fsp.writeFile(config, JSON.stringify({ hypervisor: { tpm: { caDir: dir } } }));
    expect((await tpmCa('init', '--config', config)).stdout).toContain(dir);
    expect(certsIn((await tpmCa('show', '--dir', dir)).stdout)).toBe(1);
  });

  it('usage: help, an unknown command, a relative --dir', async () => {
    expect((await tpmCa()).code).toBe(2);
    expect((await tpmCa('--help')).stdout).toContain('Usage: kata-ts tpm-ca');
    await expect(tpmCa('renew')).rejects.toBeInstanceOf(UsageError);
    await expect(tpmCa('show', '--dir', 'relative')).rejects.toBeInstanceOf(UsageError);
  });
});
