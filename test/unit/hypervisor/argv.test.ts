import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { buildQemuArgv, type QemuArgvSpec, SWIOTLB_SLABS } from '../../../src/hypervisor/argv.js';
import { thrown } from '../../helpers/kata-error.js';

const goldenDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../fixtures/argv');
const cases = readdirSync(goldenDir)
  .filter((f) => f.endsWith('.spec.json'))
  .map((f) => f.slice(0, -'.spec.json'.length))
  .sort();

function loadSpec(name: string): QemuArgvSpec {
  return JSON.parse(readFileSync(path.join(goldenDir, `${name}.spec.json`), 'utf8')) as QemuArgvSpec;
}

/** One argument per line: a golden reads as the command line, reviewable as data. */
function render(argv: string[]): string {
  return `${argv.join('\n')}\n`;
}

describe('buildQemuArgv goldens (fixtures/argv, UPDATE_GOLDENS=1 rewrites them)', () => {
  it('has golden cases', () => {
    expect(cases.length).toBeGreaterThanOrEqual(3);
  });

  it.each(cases)('%s', (name) => {
    const argv = buildQemuArgv(loadSpec(name));
    const goldenPath = path.join(goldenDir, `${name}.argv`);
    if (process.env.UPDATE_GOLDENS === '1') writeFileSync(goldenPath, render(argv));
    expect(render(argv)).toBe(readFileSync(goldenPath, 'utf8'));
    // Deterministic: a second build of the same spec is identical.
    expect(buildQemuArgv(loadSpec(name))).toEqual(argv);
  });
});

describe('buildQemuArgv properties', () => {
  const base = (): QemuArgvSpec => loadSpec('tcg-hotplug');
  const flagValues = (argv: string[], flag: string): string[] =>
    argv.flatMap((a, i) => (a === flag && argv[i + 1] !== undefined ? [argv[i + 1]!] : []));

  it('always starts paused, never reboots, and keeps the PCIe arguments last and intact', () => {
    const spec = base();
    const argv = buildQemuArgv(spec);
    expect(argv).toContain('-S');
    expect(argv).toContain('-no-reboot');
    expect(argv).not.toContain('-no-shutdown');
    expect(argv.slice(-spec.pcieArgs.length)).toEqual(spec.pcieArgs);
  });

  it('sizes virtio-mem to the headroom and plans CPU hot-plug slots', () => {
    const argv = buildQemuArgv(base());
    expect(flagValues(argv, '-smp')).toEqual(['cpus=2,maxcpus=6,sockets=1,cores=6,threads=1']);
    expect(flagValues(argv, '-m')).toEqual(['size=672M,maxmem=4768M']);
    expect(flagValues(argv, '-object')).toEqual([
      'memory-backend-memfd,id=ram0,size=672M,share=on',
      'memory-backend-memfd,id=vmem0-mem,size=4096M,share=on',
    ]);
    expect(flagValues(argv, '-numa')).toEqual(['node,memdev=ram0']);
    expect(flagValues(argv, '-device').filter((d) => d.startsWith('virtio-mem-pci'))).toHaveLength(1);
    expect(flagValues(argv, '-append')[0]).toContain('memhp_default_state=online_movable');
  });

  it('has no virtio-mem and no movable-memory parameter for a static shape', () => {
    const argv = buildQemuArgv(loadSpec('tcg-static-extra-params'));
    expect(argv.some((a) => a.includes('virtio-mem'))).toBe(false);
    expect(flagValues(argv, '-m')).toEqual(['size=512M']);
    expect(flagValues(argv, '-append')[0]).not.toContain('memhp_default_state');
  });

  it('bounds the guest kernel swiotlb pool for a non-confidential VM only, before the config kernel parameters', () => {
    const append = flagValues(buildQemuArgv({ ...base(), kernelParams: ['swiotlb=32768'] }), '-append')[0]!.split(' ');
    expect(append).toContain(`swiotlb=${SWIOTLB_SLABS}`);
    // The config's value comes later, so the kernel takes it.
    expect(append.indexOf('swiotlb=32768')).toBeGreaterThan(append.indexOf(`swiotlb=${SWIOTLB_SLABS}`));
    const confidential = flagValues(buildQemuArgv(loadSpec('kvm-confidential-hugepages')), '-append')[0]!;
    expect(confidential).not.toContain('swiotlb=');
  });

  it('backs boot RAM with shareable memfd memory even for a static shape (vhost-user needs it)', () => {
    const argv = buildQemuArgv(loadSpec('tcg-static-extra-params'));
    expect(flagValues(argv, '-object')).toEqual(['memory-backend-memfd,id=ram0,size=512M,share=on']);
    expect(flagValues(argv, '-numa')).toEqual(['node,memdev=ram0']);
  });

  it('adds the free-page-reporting balloon on its own root slot only when asked, and never to a confidential VM', () => {
    expect(buildQemuArgv(base()).join(' ')).not.toContain('virtio-balloon');
    const argv = buildQemuArgv({ ...base(), freePageReporting: true });
    expect(flagValues(argv, '-device').filter((d) => d.startsWith('virtio-balloon-pci'))).toEqual([
      'virtio-balloon-pci,id=balloon0,free-page-reporting=on,bus=pcie.0,addr=07.0',
    ]);
    const cvm = loadSpec('kvm-confidential-hugepages');
    expect(() => buildQemuArgv({ ...cvm, freePageReporting: true })).toThrow(
      expect.objectContaining({ reason: 'CONFIDENTIAL_VM_NO_BALLOON', message: expect.stringContaining('freePageReporting') }),
    );
  });

  it('adds no agent port, guest image or virtio-fs device unless the spec asks for them', () => {
    const argv = buildQemuArgv(base()).join(' ');
    expect(argv).not.toContain('org.kata-ts.agent');
    expect(argv).not.toContain('virtio-blk');
    expect(argv).not.toContain('vhost-user-fs');
  });

  it('puts the guest image and virtio-fs on their own root slots, each device independently', () => {
    const withAll = buildQemuArgv(loadSpec('tcg-guest-image'));
    const devices = flagValues(withAll, '-device');
    expect(devices.filter((d) => d.startsWith('virtio-blk-pci'))).toEqual([
      'virtio-blk-pci,id=guestimg0,drive=guestimg,serial=kata-ts-guest,bus=pcie.0,addr=04.0',
    ]);
    expect(devices.filter((d) => d.startsWith('vhost-user-fs-pci'))).toEqual([
      'vhost-user-fs-pci,id=vfs0,chardev=virtiofs,tag=kata-ts-shared,bus=pcie.0,addr=05.0',
    ]);
    expect(flagValues(withAll, '-drive')).toEqual([
      'if=none,id=guestimg,file=/usr/local/share/kata-ts/guest/guest.img,format=raw,readonly=on',
    ]);
    // Only the agent port: no image, no share.
    const spec = loadSpec('tcg-guest-image');
    const { virtiofsSocket: _, ...paths } = spec.paths;
    const agentOnly = buildQemuArgv({ ...spec, guestImagePath: undefined, paths }).join(' ');
    expect(agentOnly).toContain('virtserialport,id=agentport,bus=vser0.0,chardev=agent,name=org.kata-ts.agent');
    expect(agentOnly).not.toContain('virtio-blk');
    expect(agentOnly).not.toContain('vhost-user-fs');
  });

  it('checks the new paths like the others', () => {
    const spec = loadSpec('tcg-guest-image');
    const long = `/run/${'x'.repeat(100)}/agent.sock`;
    const agent = thrown(() => buildQemuArgv({ ...spec, paths: { ...spec.paths, agentSocket: long } }));
    expect(agent).toMatchObject({ reason: 'UNIX_SOCKET_PATH_TOO_LONG' });
    expect(agent.message).toContain('paths.agentSocket');
    const vfs = thrown(() => buildQemuArgv({ ...spec, paths: { ...spec.paths, virtiofsSocket: 'virtiofsd.sock' } }));
    expect(vfs).toMatchObject({ reason: 'VM_PATH_INVALID' });
    expect(vfs.message).toContain('paths.virtiofsSocket');
    const image = thrown(() => buildQemuArgv({ ...spec, guestImagePath: 'guest.img' }));
    expect(image).toMatchObject({ reason: 'VM_PATH_INVALID' });
    expect(image.message).toContain('guestImagePath');
  });

  it('refuses PCIe arguments on the guest image and virtio-fs slots or ids', () => {
    for (const addr of ['04.0', '05.0']) {
      const err = thrown(() => buildQemuArgv({ ...base(), pcieArgs: ['-device', `pcie-root-port,id=rp0,bus=pcie.0,addr=${addr}`] }));
      expect(err).toMatchObject({ reason: 'PCIE_ARGS_CONFLICT' });
    }
    for (const id of ['ram0', 'guestimg0', 'vfs0', 'agentport']) {
      const err = thrown(() => buildQemuArgv({ ...base(), pcieArgs: ['-device', `pcie-root-port,id=${id},bus=pcie.0,addr=08.0`] }));
      expect(err).toMatchObject({ reason: 'PCIE_ARGS_CONFLICT' });
    }
  });

  it('uses -cpu host under KVM and max under TCG', () => {
    expect(flagValues(buildQemuArgv(base()), '-cpu')).toEqual(['max']);
    expect(flagValues(buildQemuArgv({ ...base(), accel: 'kvm' }), '-cpu')).toEqual(['host']);
  });

  it('escapes commas in paths given to QEMU options', () => {
    const argv = buildQemuArgv(loadSpec('tcg-static-extra-params'));
    expect(flagValues(argv, '-chardev')).toContain('file,id=console,path=/var/lib/kata-ts/sandboxes/with,,comma/console.log,append=on');
  });

  it('refuses a unix socket path longer than sun_path, naming the field and the length', () => {
    const long = `/run/${'x'.repeat(100)}/qmp.sock`;
    const err = thrown(() => buildQemuArgv({ ...base(), paths: { ...base().paths, qmpSocket: long } }));
    expect(err).toMatchObject({ kind: 'invalid', reason: 'UNIX_SOCKET_PATH_TOO_LONG' });
    expect(err.message).toContain('paths.qmpSocket');
    expect(err.message).toContain(`${Buffer.byteLength(long)} bytes`);
    // Exactly 107 bytes still fits.
    const fits = `/run/${'y'.repeat(107 - '/run/'.length - '/r.sock'.length)}/r.sock`;
    expect(Buffer.byteLength(fits)).toBe(107);
    expect(() => buildQemuArgv({ ...base(), paths: { ...base().paths, readySocket: fits } })).not.toThrow();
  });

  it('refuses a confidential shape with hot-plug headroom', () => {
    const err = thrown(() => buildQemuArgv({ ...base(), confidential: true }));
    expect(err).toMatchObject({ kind: 'invalid', reason: 'CONFIDENTIAL_VM_NOT_STATIC' });
  });

  it.each([
    [{ vcpus: 0 }, 'shape.vcpus'],
    [{ maxVcpus: 1 }, 'shape.maxVcpus 1 is below'],
    [{ maxVcpus: 300 }, 'exceeds the 288'],
    [{ maxMemoryMiB: 100 }, 'shape.maxMemoryMiB 100 is below'],
    [{ maxMemoryMiB: 673 }, 'headroom 1 MiB'],
    [{ memoryMiB: 1.5 }, 'shape.memoryMiB'],
  ])('refuses a bad shape %j', (patch, text) => {
    const spec = base();
    const err = thrown(() => buildQemuArgv({ ...spec, shape: { ...spec.shape, ...patch } }));
    expect(err).toMatchObject({ kind: 'invalid', reason: 'VM_SHAPE_INVALID' });
    expect(err.message).toContain(text);
  });

  it('refuses PCIe arguments that collide with the hypervisor devices', () => {
    const onOurSlot = thrown(() =>
      buildQemuArgv({ ...base(), pcieArgs: ['-device', 'pcie-root-port,id=rp0,bus=pcie.0,addr=03.0,chassis=1,slot=1'] }),
    );
    expect(onOurSlot).toMatchObject({ reason: 'PCIE_ARGS_CONFLICT' });
    expect(onOurSlot.message).toContain('pcieArgs[1]');
    const onIch9 = thrown(() => buildQemuArgv({ ...base(), pcieArgs: ['-device', 'pcie-root-port,id=rp0,bus=pcie.0,addr=0x1f'] }));
    expect(onIch9).toMatchObject({ reason: 'PCIE_ARGS_CONFLICT' });
    const ourId = thrown(() => buildQemuArgv({ ...base(), pcieArgs: ['-device', 'pcie-root-port,id=vmem0,bus=pcie.0,addr=08.0'] }));
    expect(ourId).toMatchObject({ reason: 'PCIE_ARGS_CONFLICT' });
  });

  it('refuses bad names, relative paths and kernel parameters with spaces', () => {
    expect(thrown(() => buildQemuArgv({ ...base(), name: 'a b' }))).toMatchObject({ reason: 'QEMU_NAME_INVALID' });
    expect(thrown(() => buildQemuArgv({ ...base(), kernelPath: 'vmlinuz' }))).toMatchObject({ reason: 'VM_PATH_INVALID' });
    const param = thrown(() => buildQemuArgv({ ...base(), kernelParams: ['ok=1', 'two words'] }));
    expect(param).toMatchObject({ reason: 'KERNEL_PARAM_INVALID' });
    expect(param.message).toContain('kernelParams[1]');
  });
});
