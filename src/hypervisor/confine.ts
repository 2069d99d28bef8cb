/**
 * The confined VMM (pure): QEMU's seccomp option, the command that starts QEMU as an unprivileged
 * identity inside a jail, and the jail's layout. The effects that build the jail live in
 * src/runtime/sandbox/jail.ts; docs/security.md#the-vmm-jail says why it looks like this.
 *
 * Why the privileges are dropped before QEMU runs, not by QEMU: QEMU 7.2's own `-runas` calls
 * setgid/setuid after its seccomp filter is in place, and `elevateprivileges=deny` kills it for
 * that (SIGSYS). So QEMU is exec'd already unprivileged, by util-linux's setpriv, and everything it
 * opens by path (its libraries, ROMs, kernel, device nodes, sockets) must be inside the jail.
 */
import path from 'node:path';
import { invalid } from '../common/errors.js';

/** QEMU's seccomp filter with every deny group Debian's QEMU 7.2 supports (checked by `doctor`). */
export const QEMU_SECCOMP_SANDBOX = 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny';

/** util-linux setpriv, run inside the jail (so it must live under /usr, which the jail binds). */
export const SETPRIV_BINARY = '/usr/bin/setpriv';
/** util-linux nsenter: enters the pod's network namespace (no fork: the pid is QEMU's). */
export const JAIL_NSENTER_BINARY = 'nsenter';

/** The uid and gid a confined QEMU runs as (one number from hypervisor.vmmIdentities, used for both). */
export interface VmmIdentity {
  uid: number;
  gid: number;
}

/** Which device nodes QEMU needs, copied into the jail's own /dev (a tmpfs) for its identity. */
export interface JailDevices {
  /** `/dev/kvm` (acceleration kvm). */
  kvm: boolean;
  /** `/dev/net/tun` (the pod has a NIC: QEMU attaches to the TAP made for its uid). */
  tun: boolean;
  /** `/dev/vhost-net` (the NIC uses vhost). */
  vhostNet: boolean;
  /** The pod's VFIO groups: `/dev/vfio/<group>` (and `/dev/vfio/vfio`), from `devRoot`. */
  vfioGroups: number[];
  /** The VFIO functions, for the few sysfs entries QEMU reads (`/sys/bus/pci/devices/<bdf>/iommu_group`). */
  vfioFunctions: Array<{ bdf: string; group: number }>;
  /** Where the host's VFIO nodes are (config pcie.devRoot; a fixture tree in tests). */
  devRoot: string;
}

export interface JailSpec {
  /** The jail's root (QEMU's `/` after pivot_root): `<workDir>/jail`, root-owned. */
  jailDir: string;
  /** QEMU's own files (QMP, ready, agent and virtio-fs sockets, console log): owned by the identity, 0700. */
  vmmDir: string;
  /**
   * Files QEMU opens by path at start (kernel, initramfs, guest image, and the QEMU binary when
   * it is not under /usr): bound read-only at the same path inside the jail, so the argv is the
   * same confined or not. Those under /usr are reached through the /usr bind.
   */
  files: string[];
  /**
   * Directories QEMU connects to sockets in that another process of the pod owns (a vtpm pod's
   * swtpm socket dir): bound read-write at the same path. Absent: none.
   */
  dirs?: string[];
  devices: JailDevices;
  /**
   * The host's top-level entries that are symlinks into /usr (`bin -> usr/bin`, `lib64 -> usr/lib64`
   * on a merged-/usr system): the dynamic loader is found through them. Read by the caller.
   */
  rootLinks: Record<string, string>;
}

/** What jail.ts does, in order: directories, links, the mounts (one fstab), the device nodes. */
export interface JailLayout {
  jailDir: string;
  /** Directories to make (root-owned 0755 unless `owner`), parents first. */
  dirs: string[];
  /** Empty files to make as mount points of single-file binds. */
  fileMountPoints: string[];
  symlinks: Array<{ path: string; target: string }>;
  /** For `mount --all --fstab`: one spawn for every mount of the jail. */
  fstab: string;
  /** Every mount point of the fstab, in mount order. */
  mountPoints: string[];
  /** `cp -a --parents <sources> <jail>/dev`, run in `cwd` (so `net/tun` lands at `<jail>/dev/net/tun`). */
  deviceCopies: Array<{ cwd: string; sources: string[] }>;
  /** Directories under the jail's /dev to make traversable (0755) after the copies. */
  deviceDirs: string[];
  /** Device nodes in the jail handed to the identity (chown, 0600). */
  ownedDevices: string[];
  /** Symlinks QEMU's VFIO code reads instead of sysfs (it only takes the link's last component). */
  sysfsLinks: Array<{ path: string; target: string }>;
}

/** Top-level host entries that may be symlinks into /usr (merged /usr). */
export const ROOT_LINK_NAMES = ['bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32'] as const;

const JAIL_DEV_TMPFS_OPTIONS = 'nosuid,noexec,mode=0755,size=256k';

/** An fstab field: whitespace and backslash written as octal escapes (fstab(5)). */
export function fstabField(value: string): string {
  return value.replace(/[\s\\]/g, (c) => `\\${c.charCodeAt(0).toString(8).padStart(3, '0')}`);
}

function requirePath(field: string, value: string): void {
  if (!path.isAbsolute(value) || value.includes('\0') || value.includes('\n') || path.normalize(value) !== value) {
    throw invalid('VM_PATH_INVALID', `${field} ${JSON.stringify(value)} must be a normalised absolute path.`);
  }
}

/** `<jailDir><p>`: where host path `p` appears inside the jail. */
export function inJail(jailDir: string, p: string): string {
  return path.join(jailDir, p);
}

/** Is `p` reached through the jail's /usr bind? */
function underUsr(p: string): boolean {
  return p.startsWith('/usr/');
}

/**
 * Pure: the jail for one QEMU. Mounts: /usr read-only (QEMU, its libraries, modules and ROMs,
 * setpriv), a small tmpfs on /dev holding copies of exactly the device nodes this pod needs, the
 * pod's VMM dir at its own path, and each file QEMU opens that is not under /usr, read-only at its
 * own path. Nothing else of the host is in it.
 */
export function planJail(spec: JailSpec): JailLayout {
  const { jailDir, vmmDir } = spec;
  requirePath('jailDir', jailDir);
  requirePath('vmmDir', vmmDir);
  for (const f of spec.files) requirePath('jail file', f);
  for (const d of spec.dirs ?? []) requirePath('jail dir', d);
  const at = (p: string) => inJail(jailDir, p);

  const dirs = new Set<string>([at('/usr'), at('/dev')]);
  const addParents = (p: string) => {
    const chain: string[] = [];
    for (let d = path.dirname(p); d !== '/'; d = path.dirname(d)) chain.unshift(d);
    for (const d of chain) dirs.add(at(d));
  };
  addParents(vmmDir);
  dirs.add(at(vmmDir));

  const lines: string[] = [];
  const mountPoints: string[] = [];
  const mount = (source: string, target: string, type: string, options: string) => {
    lines.push(`${fstabField(source)} ${fstabField(target)} ${type} ${options} 0 0`);
    mountPoints.push(target);
  };
  // The jail itself first, bound onto itself and private: what is mounted inside stays out of the
  // host's mount peers (a systemd host's / is shared) and needs no unmount elsewhere.
  mount(jailDir, jailDir, 'none', 'bind,private,nosuid,nodev,noexec');
  mount('/usr', at('/usr'), 'none', 'bind,ro,nosuid,nodev');
  mount('kata-ts-jail-dev', at('/dev'), 'tmpfs', JAIL_DEV_TMPFS_OPTIONS);
  mount(vmmDir, at(vmmDir), 'none', 'bind,nosuid,nodev,noexec');
  for (const dir of [...new Set(spec.dirs ?? [])].sort()) {
    addParents(dir);
    dirs.add(at(dir));
    mount(dir, at(dir), 'none', 'bind,nosuid,nodev,noexec');
  }
  const fileMountPoints: string[] = [];
  for (const file of [...new Set(spec.files)].sort()) {
    if (underUsr(file)) continue;
    addParents(file);
    fileMountPoints.push(at(file));
    mount(file, at(file), 'none', 'bind,ro,nosuid,nodev');
  }

  const symlinks = Object.entries(spec.rootLinks)
    .filter(([name]) => (ROOT_LINK_NAMES as readonly string[]).includes(name))
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, target]) => ({ path: at(`/${name}`), target }));

  const d = spec.devices;
  const hostDev = ['null', 'zero', 'urandom', 'random'];
  const ownedDevices: string[] = [];
  const deviceDirs = new Set<string>();
  if (d.kvm) {
    hostDev.push('kvm');
    ownedDevices.push(at('/dev/kvm'));
  }
  if (d.tun) {
    hostDev.push('net/tun');
    ownedDevices.push(at('/dev/net/tun'));
    deviceDirs.add(at('/dev/net'));
  }
  if (d.vhostNet) {
    hostDev.push('vhost-net');
    ownedDevices.push(at('/dev/vhost-net'));
  }
  const deviceCopies: JailLayout['deviceCopies'] = [{ cwd: '/dev', sources: hostDev }];
  const groups = [...new Set(d.vfioGroups)].sort((a, b) => a - b);
  if (groups.length > 0) {
    requirePath('devices.devRoot', d.devRoot);
    deviceCopies.push({ cwd: d.devRoot, sources: ['vfio/vfio', ...groups.map((g) => `vfio/${g}`)] });
    ownedDevices.push(...groups.map((g) => at(`/dev/vfio/${g}`)));
    deviceDirs.add(at('/dev/vfio'));
  }
  const sysfsLinks = [...d.vfioFunctions]
    .sort((a, b) => a.bdf.localeCompare(b.bdf))
    .map((f) => {
      if (!/^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/.test(f.bdf)) {
        throw invalid('VM_PATH_INVALID', `VFIO function ${JSON.stringify(f.bdf)} is not a PCI address.`);
      }
      const dir = at(`/sys/bus/pci/devices/${f.bdf}`);
      addParents(`/sys/bus/pci/devices/${f.bdf}/iommu_group`);
      dirs.add(dir);
      return { path: path.join(dir, 'iommu_group'), target: `../../../../kernel/iommu_groups/${f.group}` };
    });

  return {
    jailDir,
    dirs: [...dirs].sort((a, b) => a.split('/').length - b.split('/').length || a.localeCompare(b)),
    fileMountPoints,
    symlinks,
    fstab: `${lines.join('\n')}\n`,
    mountPoints,
    deviceCopies,
    deviceDirs: [...deviceDirs].sort(),
    ownedDevices,
    sysfsLinks,
  };
}

export interface VmmLaunchSpec {
  qemuBinary: string;
  argv: string[];
  /**
   * The pod's network namespace, entered first (QEMU opens the TAP there). Absent: QEMU gets an
   * empty network namespace of its own (never the host's: no loopback services, no abstract unix
   * sockets, no route to a metadata address).
   */
  netnsPath?: string;
  /**
   * Confined: kata-ts-jailer (native/jailer.c, at `jailerBinary`) unshares a mount and an IPC
   * namespace, pivot_roots into `jailDir` and sets the resource limits; setpriv then becomes
   * `identity` with no capabilities and no_new_privs. `memlockBytes`: RLIMIT_MEMLOCK (an
   * unprivileged QEMU pins a VFIO device's DMA memory against it, having no CAP_IPC_LOCK);
   * DEFAULT_VMM_MEMLOCK_BYTES when absent.
   */
  jail?: { jailDir: string; identity: VmmIdentity; jailerBinary: string; memlockBytes?: number };
  /**
   * Confined only: the jailer waits for one byte on this descriptor after its namespaces and
   * limits are set and before it execs setpriv, so the runtime can place it in its cgroup first.
   */
  waitFd?: number;
}

/** util-linux unshare: a new network namespace for an unconfined QEMU without a pod network (no fork). */
export const UNSHARE_BINARY = 'unshare';

/**
 * RLIMIT_NOFILE of a confined QEMU: its sockets, memfds, TAP queues and one eventfd per virtqueue
 * of every device, hot-plugged ones included, fit with room to spare; a flood of opens does not.
 */
export const VMM_NOFILE_LIMIT = 8192;
/**
 * A confined QEMU's OOM score adjustment, raised to this when lower: the neutral value, not the
 * daemon's own (its unit lowers it to protect the daemon; a pod's VM must not inherit that).
 */
export const VMM_OOM_SCORE_ADJ = 0;
/** RLIMIT_MEMLOCK of a confined QEMU without VFIO: it locks no guest memory (`-overcommit mem-lock=off`). */
export const DEFAULT_VMM_MEMLOCK_BYTES = 8 * 1024 * 1024;

/**
 * Pure: the program and arguments that start QEMU. One chain of execs, no fork, so the pid is
 * QEMU's own: nsenter enters the pod's network namespace when it has one; confined, kata-ts-jailer
 * then gives QEMU a mount namespace rooted at its jail (pivot_root, cwd inside it), an IPC
 * namespace, an empty network namespace when the pod has none, and its resource limits
 * (descriptors, locked memory, no core dumps); setpriv (found at /usr/bin in the jail) sets the uid
 * and gid, clears the supplementary groups and the inheritable, ambient and bounding capability
 * sets, sets no_new_privs, and execs QEMU. Changing the uid away from 0 clears the permitted and
 * effective sets, so QEMU holds none.
 */
export function vmmLaunchCommand(spec: VmmLaunchSpec): { file: string; args: string[] } {
  const net = spec.netnsPath === undefined ? [] : [`--net=${spec.netnsPath}`];
  if (spec.jail === undefined) {
    return net.length === 0
      ? { file: UNSHARE_BINARY, args: ['--net', '--', spec.qemuBinary, ...spec.argv] }
      : { file: JAIL_NSENTER_BINARY, args: [...net, '--', spec.qemuBinary, ...spec.argv] };
  }
  const { jailDir, identity, jailerBinary } = spec.jail;
  if (spec.waitFd !== undefined && (!Number.isSafeInteger(spec.waitFd) || spec.waitFd < 3 || spec.waitFd > 63)) {
    throw invalid('VM_IDENTITY_INVALID', `the jailer's start gate must be a descriptor from 3 to 63, not ${spec.waitFd}.`);
  }
  const memlockBytes = spec.jail.memlockBytes ?? DEFAULT_VMM_MEMLOCK_BYTES;
  requirePath('jailDir', jailDir);
  requirePath('jailerBinary', jailerBinary);
  if (!Number.isSafeInteger(memlockBytes) || memlockBytes < 1) {
    throw invalid('VM_IDENTITY_INVALID', `a confined QEMU's locked-memory limit must be a positive number of bytes, not ${memlockBytes}.`);
  }
  for (const [field, id] of [
    ['uid', identity.uid],
    ['gid', identity.gid],
  ] as const) {
    if (!Number.isSafeInteger(id) || id < 1 || id > 4_294_967_294) {
      throw invalid('VM_IDENTITY_INVALID', `a confined QEMU's ${field} must be a number from 1 to 4294967294, not ${id}.`);
    }
  }
  const jailer = [
    jailerBinary,
    `--root=${jailDir}`,
    ...(net.length === 0 ? ['--new-netns'] : []),
    `--rlimit=nofile=${VMM_NOFILE_LIMIT}`,
    `--rlimit=memlock=${memlockBytes}`,
    '--rlimit=core=0',
    // QEMU is handed stdin, stdout and stderr only: the jailer closes the rest (the start gate too).
    '--keep-fds=3',
    `--oom-score-adj=${VMM_OOM_SCORE_ADJ}`,
    ...(spec.waitFd === undefined ? [] : [`--wait-fd=${spec.waitFd}`]),
    '--',
    SETPRIV_BINARY,
    `--reuid=${identity.uid}`,
    `--regid=${identity.gid}`,
    '--clear-groups',
    '--inh-caps=-all',
    '--ambient-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--',
    spec.qemuBinary,
    ...spec.argv,
  ];
  return net.length === 0 ? { file: jailer[0]!, args: jailer.slice(1) } : { file: JAIL_NSENTER_BINARY, args: [...net, '--', ...jailer] };
}
