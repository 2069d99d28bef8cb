/**
 * Where one container's things are in the guest (its root, cgroup, the pod's namespaces, /dev/shm
 * and etc directory): the guest half of `buildOciSpec`'s input. Pure.
 */
import path from 'node:path';
import type { OciGuestLayout } from './input.js';

/** Where the pod's shared things are in the guest (from the sandbox's guest pod). */
export interface GuestPod {
  pausePid: number;
  shmPath: string;
}

/** The guest layout of one container (pure). */
export function guestLayout(opts: {
  sandboxId: string;
  containerId: string;
  rootfsGuestPath: string;
  guestDir: string;
  mountSources: Record<string, string>;
  mountSubmounts?: Record<string, string[]>;
  pod: GuestPod;
}): OciGuestLayout {
  const ns = (type: string) => `/proc/${opts.pod.pausePid}/ns/${type}`;
  return {
    rootfsPath: opts.rootfsGuestPath,
    cgroupsPath: `/kata-ts/${opts.sandboxId}/${opts.containerId}`,
    mountSources: opts.mountSources,
    ...(opts.mountSubmounts === undefined ? {} : { mountSubmounts: opts.mountSubmounts }),
    namespaces: { network: ns('net'), ipc: ns('ipc'), uts: ns('uts'), pid: ns('pid') },
    shmPath: opts.pod.shmPath,
    etcDir: path.posix.join(opts.guestDir, 'etc'),
  };
}
