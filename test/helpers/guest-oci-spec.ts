/**
 * The smallest OCI spec a test hands the guest agent directly (no CRI in between): one busybox
 * process as root, /proc, optionally a tmpfs /dev, in the pod's pid, ipc and uts namespaces (those
 * of its pause process) and a mount namespace of its own.
 */
export interface GuestProbeSpec {
  /** The pod's pause process in the guest: its namespaces are joined. */
  pausePid: number;
  /** argv, busybox's path first (the rootfs holds busybox only). */
  args: readonly string[];
  /** The container's cgroup in the guest. */
  cgroupsPath: string;
  /** A tmpfs on /dev (default true); false: the rootfs's own /dev. */
  devTmpfs?: boolean;
}

/** The spec as JSON-ready data. */
export function guestProbeSpec(spec: GuestProbeSpec): Record<string, unknown> {
  const pausePid = spec.pausePid;
  return {
    ociVersion: '1.0.2',
    process: { terminal: false, user: { uid: 0, gid: 0 }, args: [...spec.args], env: ['PATH=/bin'], cwd: '/', noNewPrivileges: true },
    root: { path: 'rootfs', readonly: false },
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc' },
      ...((spec.devTmpfs ?? true)
        ? [{ destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'mode=755', 'size=65536k'] }]
        : []),
    ],
    linux: {
      namespaces: [
        { type: 'pid', path: `/proc/${pausePid}/ns/pid` },
        { type: 'ipc', path: `/proc/${pausePid}/ns/ipc` },
        { type: 'uts', path: `/proc/${pausePid}/ns/uts` },
        { type: 'mount' },
      ],
      cgroupsPath: spec.cgroupsPath,
    },
  };
}
