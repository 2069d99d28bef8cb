/**
 * Recovery's scan for stray work dirs: a state dir with no vm/ yet has none, but a vm/ that
 * cannot be read must not pass for an empty one (the daemon would then leave leftovers behind
 * silently).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { defaultConfig } from '../../../src/config/defaults.js';
import { recoverSandboxes } from '../../../src/runtime/sandbox/recover.js';
import type { SandboxManagerDeps } from '../../../src/runtime/sandbox/types.js';

function depsFor(stateDir: string): SandboxManagerDeps {
  return {
    config: { ...defaultConfig(), stateDir },
    logger: pino({ level: 'silent' }),
    store: { load: async () => ({ records: [] }) },
  } as unknown as SandboxManagerDeps;
}

describe('recoverSandboxes and the vm/ directory', () => {
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-recover-'));
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('a state dir without vm/ recovers nothing, without error', async () => {
    await expect(recoverSandboxes(depsFor(stateDir))).resolves.toEqual([]);
  });

  it('a vm/ that cannot be read as a directory fails recovery instead of passing for empty', async () => {
    await writeFile(path.join(stateDir, 'vm'), 'not a directory');
    await expect(recoverSandboxes(depsFor(stateDir))).rejects.toThrow(expect.objectContaining({ code: 'ENOTDIR' }));
  });
});
