/**
 * The template execute step's checks that come before any QEMU: the template directory (never
 * built over, must be tmpfs) and the verification of a saved template (record, RAM file, state).
 * Files only; no VM (test/integration/template.test.ts boots them).
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { TEMPLATE_RECORD_VERSION, type TemplateKey, type TemplateVmSpec, templatePaths } from '../../../src/hypervisor/template.js';
import { buildTemplate, loadVerifiedTemplate, templateInputFingerprint } from '../../../src/hypervisor/template-execute.js';

const hex = (c: string) => c.repeat(64);
const key: TemplateKey = {
  qemuBinarySha256: hex('1'),
  kernelSha256: hex('2'),
  initrdSha256: hex('3'),
  guestImageSha256: null,
  argvSha256: hex('5'),
};
const spec: TemplateVmSpec = {
  shape: { vcpus: 1, maxVcpus: 1, memoryMiB: 128, maxMemoryMiB: 128, hugepages: [], kernelParams: [] },
  accel: 'tcg',
  kernelPath: '/nonexistent/vmlinuz',
  initrdPath: '/nonexistent/initrd',
  kernelParams: [],
  pcieArgs: [],
  confidential: false,
  withAgent: true,
};
const dirs: string[] = [];
async function tmp(base: string): Promise<string> {
  const d = await fsp.mkdtemp(path.join(base, 'kata-ts-tpl-unit-'));
  dirs.push(d);
  return d;
}
afterEach(async () => {
  for (const d of dirs.splice(0)) await fsp.rm(d, { recursive: true, force: true });
});

/** A template directory as buildTemplate leaves it, with a state of `state` bytes. */
async function fakeTemplate(dir: string, state: Buffer): Promise<void> {
  const files = templatePaths(dir);
  await fsp.mkdir(dir);
  await fsp.writeFile(files.ramFile, Buffer.alloc(4096), { mode: 0o444 });
  await fsp.writeFile(files.stateFile, state, { mode: 0o444 });
  const record = {
    version: TEMPLATE_RECORD_VERSION,
    key,
    stateSha256: createHash('sha256').update(state).digest('hex'),
    stateBytes: state.length,
    ramBytes: 4096,
    guest: { vcpus: 1, memoryKiB: 200_000, onlineMemoryKiB: 262_144 },
    builtAt: new Date().toISOString(),
    buildMs: 1,
  };
  await fsp.writeFile(files.recordFile, JSON.stringify(record));
}

const build = (templateDir: string, workDir: string) =>
  buildTemplate({
    qemuBinary: '/nonexistent/qemu',
    spec,
    key,
    templateDir,
    workDir,
    logger: silentLogger(),
    waitAgentReady: async () => undefined,
  });

describe('buildTemplate before QEMU', () => {
  it('never builds over an existing directory, and leaves it as it was', async () => {
    const base = await tmp('/dev/shm');
    await fsp.writeFile(path.join(base, 'keep'), 'x');
    await expect(build(base, base)).rejects.toMatchObject({ reason: 'TEMPLATE_DIR_UNUSABLE' });
    expect(await fsp.readFile(path.join(base, 'keep'), 'utf8')).toBe('x');
  });

  it('refuses a directory that is not on tmpfs and removes what it made', async () => {
    const base = await tmp(os.tmpdir());
    const stat = await fsp.statfs(base);
    if (stat.type === 0x01021994) return; // this machine's tmpdir is tmpfs: nothing to refuse
    const dir = path.join(base, 'tpl');
    await expect(build(dir, base)).rejects.toMatchObject({ reason: 'TEMPLATE_RAM_NOT_ON_TMPFS' });
    await expect(fsp.access(dir)).rejects.toThrow();
  });
});

describe('loadVerifiedTemplate', () => {
  it('returns the state bytes of a template that matches', async () => {
    const dir = path.join(await tmp('/dev/shm'), 'tpl');
    await fakeTemplate(dir, Buffer.from('device state'));
    const { record, state } = await loadVerifiedTemplate(dir, key);
    expect(record.stateBytes).toBe(12);
    expect(state.toString()).toBe('device state');
  });

  it('refuses another key, a writable or resized RAM file, an altered state, a missing record', async () => {
    const base = await tmp('/dev/shm');
    const dir = path.join(base, 'tpl');
    await fakeTemplate(dir, Buffer.from('device state'));
    const files = templatePaths(dir);
    await expect(loadVerifiedTemplate(dir, { ...key, initrdSha256: hex('9') })).rejects.toMatchObject({
      reason: 'TEMPLATE_KEY_MISMATCH',
      message: expect.stringContaining('initrdSha256'),
    });
    await fsp.chmod(files.ramFile, 0o644);
    await expect(loadVerifiedTemplate(dir, key)).rejects.toMatchObject({ reason: 'TEMPLATE_RAM_FILE_INVALID' });
    await fsp.chmod(files.ramFile, 0o444);
    await fsp.chmod(files.stateFile, 0o644);
    await fsp.writeFile(files.stateFile, 'device statE');
    await expect(loadVerifiedTemplate(dir, key)).rejects.toMatchObject({ reason: 'TEMPLATE_STATE_CORRUPT' });
    await fsp.rm(files.recordFile);
    await expect(loadVerifiedTemplate(dir, key)).rejects.toMatchObject({ reason: 'TEMPLATE_RECORD_INVALID' });
    // A record that is a symlink is not followed.
    await fsp.symlink(path.join(base, 'elsewhere.json'), files.recordFile);
    await expect(loadVerifiedTemplate(dir, key)).rejects.toMatchObject({ reason: 'TEMPLATE_RECORD_INVALID' });
  });
});

describe('templateInputFingerprint', () => {
  it('stays while the files stay, and changes when one is rewritten (even with the same bytes) or replaced', async () => {
    const dir = await tmp(os.tmpdir());
    const files = { qemu: path.join(dir, 'qemu'), kernel: path.join(dir, 'vmlinuz'), initrd: path.join(dir, 'initrd') };
    for (const f of Object.values(files)) await fsp.writeFile(f, 'x');
    const own = { ...spec, kernelPath: files.kernel, initrdPath: files.initrd };
    const first = await templateInputFingerprint(files.qemu, own);
    expect(await templateInputFingerprint(files.qemu, own)).toBe(first);
    // Same content, written again: its change time moves.
    await new Promise((r) => setTimeout(r, 5));
    await fsp.writeFile(files.kernel, 'x');
    const second = await templateInputFingerprint(files.qemu, own);
    expect(second).not.toBe(first);
    // Replaced by another file (a new inode) of the same size.
    await fsp.writeFile(`${files.initrd}.new`, 'y');
    await fsp.rename(`${files.initrd}.new`, files.initrd);
    expect(await templateInputFingerprint(files.qemu, own)).not.toBe(second);
    // Another shape: another argv digest.
    expect(await templateInputFingerprint(files.qemu, { ...own, kernelParams: ['quiet'] })).not.toBe(
      await templateInputFingerprint(files.qemu, own),
    );
  });
});
