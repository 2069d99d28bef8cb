/**
 * What a test may call its own runtime's on the machine's shared places (ownSandboxKeys and
 * ownNetnsNames in test/helpers/runtime-daemon.ts, used by the soak's orphan check and the network
 * tests): the ids the test knows, its state dir's records and work dirs, and what its own daemon's
 * log names; never a `kata-ts-*` namespace of another run.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { netnsNameFor } from '../../../src/network/index.js';
import { ownNetnsNames, ownSandboxKeys } from '../../helpers/runtime-daemon.js';

const KNOWN = `${'1'.repeat(16)}${'a'.repeat(48)}`;
const RECORDED = `${'2'.repeat(16)}${'b'.repeat(48)}`;
const POOLED = `${'3'.repeat(16)}${'c'.repeat(48)}`;
const LOGGED = `${'4'.repeat(16)}${'d'.repeat(48)}`;
const CALLER_ID = 'pod-sandbox-0001'; // a shim's caller-chosen id: keyed by its sha256

describe('ownSandboxKeys / ownNetnsNames', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-own-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('collects known ids, records, work dirs and the log’s ids; nothing else', async () => {
    const stateDir = path.join(dir, 'state');
    await mkdir(path.join(stateDir, 'sandboxes'), { recursive: true });
    await mkdir(path.join(stateDir, 'pool'), { recursive: true });
    await mkdir(path.join(stateDir, 'vm', '5'.repeat(16)), { recursive: true });
    await writeFile(path.join(stateDir, 'sandboxes', `${RECORDED}.json`), '{}');
    await writeFile(path.join(stateDir, 'sandboxes', `${CALLER_ID}.json`), '{}');
    await writeFile(path.join(stateDir, 'pool', `${POOLED}.json`), '{}');
    const logFile = path.join(dir, 'daemon.log');
    await writeFile(
      logFile,
      [
        JSON.stringify({ level: 30, sandboxId: LOGGED, msg: 'rolled back' }),
        JSON.stringify({ level: 30, netns: `kata-ts-${'6'.repeat(16)}`, msg: 'pod network attached' }),
        'not json',
      ].join('\n'),
    );
    const rt = { stateDir, logFile };
    const keys = await ownSandboxKeys(rt, [KNOWN]);
    expect(keys).toEqual(
      [
        '1'.repeat(16),
        '2'.repeat(16),
        '3'.repeat(16),
        '4'.repeat(16),
        '5'.repeat(16),
        '6'.repeat(16),
        netnsNameFor(CALLER_ID).slice('kata-ts-'.length),
      ].sort(),
    );
    const names = await ownNetnsNames(rt, [KNOWN]);
    for (const id of [KNOWN, RECORDED, POOLED, LOGGED, CALLER_ID]) expect(names).toContain(netnsNameFor(id));
    // Another run's pod, never mentioned here, is not ours.
    expect(names).not.toContain(netnsNameFor(`${'7'.repeat(16)}${'e'.repeat(48)}`));
  });

  it('a runtime that never started owns only what the test knows', async () => {
    expect(await ownSandboxKeys({ stateDir: path.join(dir, 'none'), logFile: path.join(dir, 'none.log') }, [])).toEqual([]);
  });
});
