/**
 * The confined VMM's pure parts: the launch command (nsenter --net, kata-ts-jailer, setpriv, QEMU), the jail's
 * layout (one fstab, device copies, sysfs links) and QEMU's -sandbox option in the argv.
 */
import { describe, expect, it } from 'vitest';
import {
  buildQemuArgv,
  fstabField,
  planJail,
  QEMU_SECCOMP_SANDBOX,
  type QemuArgvSpec,
  vmmLaunchCommand,
} from '../../../src/hypervisor/index.js';

const W = '/var/lib/kata-ts/vm/0123456789abcdef';
const identity = { uid: 2_000_000_007, gid: 2_000_000_007 };
const noDevices = { kvm: false, tun: false, vhostNet: false, vfioGroups: [], vfioFunctions: [], devRoot: '/dev' };

describe('vmmLaunchCommand', () => {
  const J = '/opt/kata-ts/dist/native/kata-ts-jailer';
  const setpriv = [
    '/usr/bin/setpriv',
    '--reuid=2000000007',
    '--regid=2000000007',
    '--clear-groups',
    '--inh-caps=-all',
    '--ambient-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--',
  ];

  it("unconfined: through nsenter --net into the pod's namespace, or unshare --net into an empty one (never the host's)", () => {
    expect(vmmLaunchCommand({ qemuBinary: 'qemu-system-x86_64', argv: ['-S'] })).toEqual({
      file: 'unshare',
      args: ['--net', '--', 'qemu-system-x86_64', '-S'],
    });
    expect(vmmLaunchCommand({ qemuBinary: 'qemu-system-x86_64', argv: ['-S'], netnsPath: '/run/netns/p' })).toEqual({
      file: 'nsenter',
      args: ['--net=/run/netns/p', '--', 'qemu-system-x86_64', '-S'],
    });
  });

  it('confined: one exec chain (no shell, no fork): nsenter --net, the jailer (pivot_root, limits), setpriv, QEMU', () => {
    const jail = { jailDir: `${W}/jail`, identity, jailerBinary: J };
    expect(vmmLaunchCommand({ qemuBinary: 'qemu-system-x86_64', argv: ['-S', '-name', 'x'], netnsPath: '/run/netns/p', jail })).toEqual({
      file: 'nsenter',
      args: [
        '--net=/run/netns/p',
        '--',
        J,
        `--root=${W}/jail`,
        '--rlimit=nofile=8192',
        '--rlimit=memlock=8388608',
        '--rlimit=core=0',
        '--keep-fds=3',
        '--oom-score-adj=0',
        '--',
        ...setpriv,
        'qemu-system-x86_64',
        '-S',
        '-name',
        'x',
      ],
    });
  });

  it('confined without a pod network: the jailer itself first, with an empty network namespace of its own', () => {
    const jail = { jailDir: `${W}/jail`, identity, jailerBinary: J };
    const { file, args } = vmmLaunchCommand({ qemuBinary: 'q', argv: [], jail });
    expect([file, ...args.slice(0, 7)]).toEqual([
      J,
      `--root=${W}/jail`,
      '--new-netns',
      '--rlimit=nofile=8192',
      '--rlimit=memlock=8388608',
      '--rlimit=core=0',
      '--keep-fds=3',
      '--oom-score-adj=0',
    ]);
  });

  it("VFIO: RLIMIT_MEMLOCK sized by the caller (the VM's memory), set by the jailer while still root", () => {
    const { args } = vmmLaunchCommand({
      qemuBinary: 'q',
      argv: [],
      jail: { jailDir: `${W}/jail`, identity, jailerBinary: J, memlockBytes: 1_140_850_688 },
    });
    expect(args).toContain('--rlimit=memlock=1140850688');
    expect(() =>
      vmmLaunchCommand({ qemuBinary: 'q', argv: [], jail: { jailDir: '/j', identity, jailerBinary: J, memlockBytes: 0 } }),
    ).toThrow(expect.objectContaining({ reason: 'VM_IDENTITY_INVALID' }));
  });

  it('refuses root, a non-number, a relative jail or jailer', () => {
    for (const bad of [0, -1, 1.5, 4_294_967_295]) {
      expect(() =>
        vmmLaunchCommand({ qemuBinary: 'q', argv: [], jail: { jailDir: '/j', identity: { uid: bad, gid: 5 }, jailerBinary: J } }),
      ).toThrow(expect.objectContaining({ reason: 'VM_IDENTITY_INVALID' }));
    }
    for (const jail of [
      { jailDir: 'j', identity, jailerBinary: J },
      { jailDir: '/j', identity, jailerBinary: 'kata-ts-jailer' },
    ]) {
      expect(() => vmmLaunchCommand({ qemuBinary: 'q', argv: [], jail })).toThrow(expect.objectContaining({ reason: 'VM_PATH_INVALID' }));
    }
  });
});

describe('planJail', () => {
  it('one fstab: the jail private on itself, /usr read only, a tmpfs /dev, the VMM dir and files outside /usr at their own paths', () => {
    const layout = planJail({
      jailDir: `${W}/jail`,
      vmmDir: `${W}/vmm`,
      files: ['/usr/local/share/kata-ts/guest/vmlinuz', '/opt/guest/initramfs.cpio.gz', '/opt/guest/initramfs.cpio.gz'],
      devices: noDevices,
      rootLinks: { lib: 'usr/lib', lib64: 'usr/lib64', bin: 'usr/bin', etc: 'usr/etc' },
    });
    const J = `${W}/jail`;
    expect(layout.fstab.split('\n')).toEqual([
      `${J} ${J} none bind,private,nosuid,nodev,noexec 0 0`,
      `/usr ${J}/usr none bind,ro,nosuid,nodev 0 0`,
      `kata-ts-jail-dev ${J}/dev tmpfs nosuid,noexec,mode=0755,size=256k 0 0`,
      `${W}/vmm ${J}${W}/vmm none bind,nosuid,nodev,noexec 0 0`,
      `/opt/guest/initramfs.cpio.gz ${J}/opt/guest/initramfs.cpio.gz none bind,ro,nosuid,nodev 0 0`,
      '',
    ]);
    expect(layout.mountPoints).toEqual([J, `${J}/usr`, `${J}/dev`, `${J}${W}/vmm`, `${J}/opt/guest/initramfs.cpio.gz`]);
    expect(layout.fileMountPoints).toEqual([`${J}/opt/guest/initramfs.cpio.gz`]);
    // Parents first; each directory once.
    expect(layout.dirs).toEqual([
      `${J}/dev`,
      `${J}/opt`,
      `${J}/usr`,
      `${J}/var`,
      `${J}/opt/guest`,
      `${J}/var/lib`,
      `${J}/var/lib/kata-ts`,
      `${J}/var/lib/kata-ts/vm`,
      `${J}${W}`,
      `${J}${W}/vmm`,
    ]);
    // Only the known top-level names, as the host has them.
    expect(layout.symlinks).toEqual([
      { path: `${J}/bin`, target: 'usr/bin' },
      { path: `${J}/lib`, target: 'usr/lib' },
      { path: `${J}/lib64`, target: 'usr/lib64' },
    ]);
    expect(layout.deviceCopies).toEqual([{ cwd: '/dev', sources: ['null', 'zero', 'urandom', 'random'] }]);
    expect([layout.ownedDevices, layout.deviceDirs, layout.sysfsLinks]).toEqual([[], [], []]);
  });

  it("exactly the pod's device nodes: kvm, the tun, vhost-net and its VFIO groups (from devRoot) for its identity", () => {
    const J = `${W}/jail`;
    const layout = planJail({
      jailDir: J,
      vmmDir: `${W}/vmm`,
      files: [],
      devices: {
        kvm: true,
        tun: true,
        vhostNet: true,
        vfioGroups: [12, 3, 12],
        vfioFunctions: [
          { bdf: '0000:01:00.1', group: 12 },
          { bdf: '0000:01:00.0', group: 12 },
        ],
        devRoot: '/srv/fixture/dev',
      },
      rootLinks: {},
    });
    expect(layout.deviceCopies).toEqual([
      { cwd: '/dev', sources: ['null', 'zero', 'urandom', 'random', 'kvm', 'net/tun', 'vhost-net'] },
      { cwd: '/srv/fixture/dev', sources: ['vfio/vfio', 'vfio/3', 'vfio/12'] },
    ]);
    expect(layout.ownedDevices).toEqual([`${J}/dev/kvm`, `${J}/dev/net/tun`, `${J}/dev/vhost-net`, `${J}/dev/vfio/3`, `${J}/dev/vfio/12`]);
    expect(layout.deviceDirs).toEqual([`${J}/dev/net`, `${J}/dev/vfio`]);
    expect(layout.sysfsLinks).toEqual([
      { path: `${J}/sys/bus/pci/devices/0000:01:00.0/iommu_group`, target: '../../../../kernel/iommu_groups/12' },
      { path: `${J}/sys/bus/pci/devices/0000:01:00.1/iommu_group`, target: '../../../../kernel/iommu_groups/12' },
    ]);
    expect(layout.dirs).toContain(`${J}/sys/bus/pci/devices/0000:01:00.0`);
  });

  it('escapes fstab fields and refuses relative, unnormalised or NUL paths and odd PCI addresses', () => {
    expect(fstabField('/a b\\c\td')).toBe('/a\\040b\\134c\\011d');
    const layout = planJail({ jailDir: '/s t/jail', vmmDir: '/s t/vmm', files: [], devices: noDevices, rootLinks: {} });
    expect(layout.fstab.split('\n')[0]).toBe('/s\\040t/jail /s\\040t/jail none bind,private,nosuid,nodev,noexec 0 0');
    for (const bad of ['relative/jail', '/a/../b', '/a\0b']) {
      expect(() => planJail({ jailDir: bad, vmmDir: '/v', files: [], devices: noDevices, rootLinks: {} })).toThrow(
        expect.objectContaining({ reason: 'VM_PATH_INVALID' }),
      );
    }
    expect(() =>
      planJail({
        jailDir: '/j',
        vmmDir: '/v',
        files: [],
        devices: { ...noDevices, vfioGroups: [1], vfioFunctions: [{ bdf: '../../etc', group: 1 }] },
        rootLinks: {},
      }),
    ).toThrow(expect.objectContaining({ reason: 'VM_PATH_INVALID' }));
  });
});

describe('-sandbox in the argv', () => {
  const spec: QemuArgvSpec = {
    name: 'kata-ts-x',
    shape: { vcpus: 1, maxVcpus: 1, memoryMiB: 512, maxMemoryMiB: 512, hugepages: [], kernelParams: [] },
    accel: 'tcg',
    kernelPath: '/k',
    initrdPath: '/i',
    kernelParams: [],
    paths: { qmpSocket: `${W}/vmm/qmp.sock`, readySocket: `${W}/vmm/ready.sock`, consoleLog: `${W}/vmm/console.log` },
    pcieArgs: [],
    confidential: false,
  };

  it('QEMU gets the seccomp filter right after its other global options; absent when the handler opted out', () => {
    const argv = buildQemuArgv({ ...spec, seccompSandbox: QEMU_SECCOMP_SANDBOX });
    expect(argv.slice(argv.indexOf('-sandbox'), argv.indexOf('-sandbox') + 2)).toEqual([
      '-sandbox',
      'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    ]);
    expect(argv.indexOf('-sandbox')).toBe(argv.indexOf('timestamp=on') + 1);
    expect(buildQemuArgv(spec)).not.toContain('-sandbox');
  });

  it('refuses a value that is not a -sandbox option list', () => {
    for (const bad of ['off', 'on,spawn=deny,,x', 'on,spawn=deny -drive x']) {
      expect(() => buildQemuArgv({ ...spec, seccompSandbox: bad })).toThrow(expect.objectContaining({ reason: 'QEMU_SANDBOX_INVALID' }));
    }
  });
});
