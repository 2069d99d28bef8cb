import { describe, expect, it } from 'vitest';
import {
  checkCloneHotplug,
  planClone9pDevice,
  planCloneArgv,
  planCloneRestore,
  planTemplateArgv,
  planTemplateSave,
  TEMPLATE_RECORD_VERSION,
  type TemplateKey,
  type TemplateRecord,
  type TemplateVmSpec,
  templateArgvDigest,
  verifyTemplateRecord,
} from '../../../src/hypervisor/template.js';

const spec: TemplateVmSpec = {
  shape: { vcpus: 1, maxVcpus: 2, memoryMiB: 512, maxMemoryMiB: 1024, hugepages: [], kernelParams: [] },
  accel: 'tcg',
  kernelPath: '/g/vmlinuz',
  initrdPath: '/g/initramfs.cpio.gz',
  guestImagePath: '/g/guest.img',
  kernelParams: [],
  pcieArgs: [],
  confidential: false,
  withAgent: true,
};
const paths = (dir: string) => ({
  qmpSocket: `${dir}/qmp.sock`,
  readySocket: `${dir}/ready.sock`,
  consoleLog: `${dir}/console.log`,
  agentSocket: `${dir}/agent.sock`,
});
const hex = (c: string) => c.repeat(64);
const key: TemplateKey = {
  qemuBinarySha256: hex('1'),
  kernelSha256: hex('2'),
  initrdSha256: hex('3'),
  guestImageSha256: hex('4'),
  argvSha256: hex('5'),
};
const record: TemplateRecord = {
  version: TEMPLATE_RECORD_VERSION,
  key,
  stateSha256: hex('a'),
  stateBytes: 1000,
  ramBytes: 512 << 20,
  guest: { vcpus: 1, memoryKiB: 466436, onlineMemoryKiB: 524288 },
  builtAt: '2026-11-29T00:00:00Z',
  buildMs: 1,
};

describe('template planners', () => {
  it('the template maps its boot RAM from the file, shared; the clone maps it private and waits for its state', () => {
    const t = planTemplateArgv(spec, 'tpl', paths('/w/t'), '/dev/shm/tpl/ram');
    expect(t).toContain('memory-backend-file,id=ram0,size=512M,mem-path=/dev/shm/tpl/ram,share=on');
    expect(t.some((a) => a.startsWith('memory-backend-memfd,id=ram0'))).toBe(false);
    expect(t).not.toContain('-incoming');
    const c = planCloneArgv(spec, 'c1', paths('/w/c1'), '/dev/shm/tpl/ram');
    expect(c).toContain('memory-backend-file,id=ram0,size=512M,mem-path=/dev/shm/tpl/ram,share=off');
    expect(c.slice(-2)).toEqual(['-incoming', 'defer']);
    // Same devices in the same order: only the paths, name, share= and -incoming differ.
    const norm = (argv: string[], dir: string, name: string) =>
      argv.map((a) =>
        a
          .replaceAll(dir, '<d>')
          .replace(`guest=${name},`, 'guest=<n>,')
          .replace(/share=o(n|ff)$/, 'share=?'),
      );
    expect(norm(c, '/w/c1', 'c1').slice(0, -2)).toEqual(norm(t, '/w/t', 'tpl'));
    // The virtio-mem headroom stays an anonymous memfd of each VM's own.
    expect(c.some((a) => a.startsWith('memory-backend-memfd,id=vmem0-mem'))).toBe(true);
  });

  it('a clone with a 9p share carries the fsdev backend from its start; the device is hot-plugged later', () => {
    const c = planCloneArgv(spec, 'c1', paths('/w/c1'), '/dev/shm/tpl/ram', { hostDir: '/s/pod1', securityModel: 'mapped-xattr' });
    expect(c.slice(-4)).toEqual(['-fsdev', 'local,id=shared9p,path=/s/pod1,security_model=mapped-xattr', '-incoming', 'defer']);
    expect(c.some((a) => a.startsWith('virtio-9p'))).toBe(false);
    expect(planClone9pDevice('rp0')).toEqual({
      driver: 'virtio-9p-pci',
      id: 'p9shared',
      fsdev: 'shared9p',
      mount_tag: 'kata-ts-shared',
      bus: 'rp0',
      addr: '0',
    });
    expect(() => planCloneArgv(spec, 'c1', paths('/w'), '/r', { hostDir: 'rel', securityModel: 'none' })).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_ARGV_UNSUPPORTED', message: expect.stringContaining('share.hostDir') }),
    );
  });

  it('the key part of the argv does not depend on paths or name, and follows the shape', () => {
    expect(templateArgvDigest(spec)).toMatch(/^[0-9a-f]{64}$/);
    expect(templateArgvDigest({ ...spec, shape: { ...spec.shape, memoryMiB: 256 } })).not.toBe(templateArgvDigest(spec));
    expect(templateArgvDigest({ ...spec })).toBe(templateArgvDigest(spec));
  });

  it('refuses a confidential VM, a TEE, and a RAM path QEMU cannot carry', () => {
    expect(() => planTemplateArgv({ ...spec, confidential: true }, 't', paths('/w'), '/r')).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_CONFIDENTIAL' }),
    );
    expect(() => planCloneArgv({ ...spec, tee: { kind: 'snp', firmwarePath: '/f' } }, 't', paths('/w'), '/r')).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_CONFIDENTIAL' }),
    );
    expect(() => planTemplateArgv(spec, 't', paths('/w'), '/dev/shm/a,b')).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_RAM_FILE_INVALID' }),
    );
  });

  it('save and restore set x-ignore-shared first; vhost-user devices are refused for clones', () => {
    expect(planTemplateSave('unix:/w/m.sock').map((s) => s.command)).toEqual(['migrate-set-capabilities', 'stop', 'migrate']);
    expect(planCloneRestore('unix:/w/m.sock')).toEqual([
      { command: 'migrate-set-capabilities', arguments: { capabilities: [{ capability: 'x-ignore-shared', state: true }] } },
      { command: 'migrate-incoming', arguments: { uri: 'unix:/w/m.sock' } },
    ]);
    expect(() => checkCloneHotplug('vhost-user-fs-pci')).toThrow(expect.objectContaining({ reason: 'TEMPLATE_CLONE_VHOST_USER' }));
    expect(() => checkCloneHotplug('virtio-9p-pci')).not.toThrow();
  });

  it('verifies a record against the key wanted, naming every field that differs', () => {
    expect(verifyTemplateRecord(record, key)).toBe(record);
    expect(() => verifyTemplateRecord(record, { ...key, kernelSha256: hex('9'), argvSha256: hex('8') })).toThrow(
      expect.objectContaining({ reason: 'TEMPLATE_KEY_MISMATCH', message: expect.stringContaining('kernelSha256, argvSha256') }),
    );
    const { guest: _guest, ...withoutGuest } = record;
    for (const bad of [
      null,
      {},
      { ...record, version: 1 },
      { ...record, stateSha256: 'x' },
      { ...record, stateBytes: 0 },
      // A version-1 record: no guest report, so a clone that is not grown would wait for one.
      { ...withoutGuest, version: 1 },
      withoutGuest,
      { ...record, guest: { ...record.guest, vcpus: 0 } },
      { ...record, guest: { ...record.guest, onlineMemoryKiB: '524288' } },
    ]) {
      expect(() => verifyTemplateRecord(bad, key)).toThrow(expect.objectContaining({ reason: 'TEMPLATE_RECORD_INVALID' }));
    }
  });
});
