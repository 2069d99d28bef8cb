/**
 * The container's mounts: the standard kernel filesystems, the pod's /dev/shm, the pod's etc
 * files, then the CRI mounts with their sources as the guest sees them. Pure.
 */
import type { OciContainerInput, OciGuestLayout, OciMountInput } from './input.js';
import { fieldError } from './process.js';
import type { OciMount } from './spec-types.js';

/** The kernel filesystems every container gets (the set containerd's default spec mounts). */
export function standardMounts(privileged: boolean): OciMount[] {
  // sysfs and the cgroup tree are read-only unless privileged: writing there changes the guest.
  const ro = privileged ? [] : ['ro'];
  return [
    { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
    {
      destination: '/dev/pts',
      type: 'devpts',
      source: 'devpts',
      options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'],
    },
    { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', ...ro] },
    { destination: '/sys/fs/cgroup', type: 'cgroup2', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', ...ro] },
  ];
}

const PROPAGATION = {
  PROPAGATION_PRIVATE: 'rprivate',
  PROPAGATION_HOST_TO_CONTAINER: 'rslave',
  PROPAGATION_BIDIRECTIONAL: 'rshared',
} as const;

function normalisePath(p: string): string {
  const parts = p.split('/').filter((s) => s !== '' && s !== '.');
  return `/${parts.join('/')}`;
}

/** Whether `parent` is a strict ancestor of `child` (both normalised). */
function isAncestor(parent: string, child: string): boolean {
  return parent === '/' ? child !== '/' : child.startsWith(`${parent}/`);
}

/**
 * The request's order, except that a mount moves ahead of the first earlier mount nested under
 * it: the OCI runtime mounts in list order, and a parent mounted later would hide its child.
 */
function parentsFirst(mounts: readonly OciMount[]): OciMount[] {
  const out: OciMount[] = [];
  for (const m of mounts) {
    const firstChild = out.findIndex((o) => isAncestor(m.destination, o.destination));
    if (firstChild < 0) out.push(m);
    else out.splice(firstChild, 0, m);
  }
  return out;
}

export interface CriMountPlan {
  mounts: OciMount[];
  /** Container paths the request mounts (its own /etc/hosts, for one, replaces ours). */
  destinations: Set<string>;
  /** The root's propagation, as strong as the strongest mount below it needs. */
  rootfsPropagation?: 'shared' | 'slave';
}

/**
 * The CRI mounts, bind-mounted from where the guest sees their sources, in the request's order
 * with parents ahead of their children. Features the guest cannot give are refused, naming the mount.
 */
export function criMounts(container: OciContainerInput, guest: OciGuestLayout, privileged: boolean): CriMountPlan {
  const given = container.mounts ?? [];
  const seen = new Set<string>();
  let needsShared = false;
  let needsSlave = false;
  const planned = given.flatMap((m: OciMountInput, i): OciMount[] => {
    const field = `container.mounts[${i}]`;
    if (!m.container_path.startsWith('/') || m.container_path.includes('\0') || m.container_path.split('/').includes('..')) {
      throw fieldError('OCI_MOUNT_PATH_INVALID', `${field}.container_path`, `is "${m.container_path}", not an absolute path without ".."`);
    }
    const destination = normalisePath(m.container_path);
    if (seen.has(destination)) throw fieldError('OCI_MOUNT_DUPLICATE', `${field}.container_path`, `mounts "${destination}" a second time`);
    seen.add(destination);
    if ((m.uidMappings?.length ?? 0) > 0 || (m.gidMappings?.length ?? 0) > 0) {
      throw fieldError(
        'OCI_MOUNT_IDMAP_UNSUPPORTED',
        `${field}.uidMappings`,
        'asks for an id-mapped mount, which needs a user namespace kata-ts does not offer',
      );
    }
    if (m.image != null && (m.image.image ?? '') !== '') {
      throw fieldError('OCI_MOUNT_IMAGE_UNSUPPORTED', `${field}.image`, 'asks for an image volume, which kata-ts does not offer yet');
    }
    const source = guest.mountSources[m.container_path] ?? guest.mountSources[destination];
    if (source === undefined || source === '') {
      throw fieldError('OCI_MOUNT_SOURCE_UNRESOLVED', `${field}.host_path`, 'has no source in the guest');
    }
    const propagation = PROPAGATION[m.propagation ?? 'PROPAGATION_PRIVATE'];
    if (propagation === 'rshared') {
      if (!privileged) {
        throw fieldError(
          'OCI_MOUNT_PROPAGATION_PRIVILEGED',
          `${field}.propagation`,
          'is BIDIRECTIONAL, which only a privileged container may ask for',
        );
      }
      needsShared = true;
    }
    if (propagation === 'rslave') needsSlave = true;
    // Recursive read-only (the CRI's rules: read-only and private, or refused). The host makes
    // every mount below the volume read-only too; in the guest the whole volume is one virtio-fs
    // mount (host submounts are not announced), so a plain read-only bind covers all of it.
    if (m.recursive_read_only === true) {
      if (m.readonly !== true) {
        throw fieldError('OCI_MOUNT_RRO_INVALID', `${field}.recursive_read_only`, 'is set on a mount that is not read-only');
      }
      if (propagation !== 'rprivate') {
        throw fieldError(
          'OCI_MOUNT_RRO_INVALID',
          `${field}.recursive_read_only`,
          `is set on a mount with propagation ${m.propagation}, but only PROPAGATION_PRIVATE can be recursively read-only`,
        );
      }
    }
    const mount: OciMount = {
      destination,
      type: 'bind',
      source,
      // selinux_relabel is the host's business (the kubelet sets it when the host runs SELinux);
      // the guest has no SELinux, so there is nothing to relabel here.
      options: ['rbind', propagation, m.readonly === true ? 'ro' : 'rw'],
    };
    if (m.readonly !== true || m.recursive_read_only === true) return [mount];
    return [mount, ...submountBinds(guest.mountSubmounts?.[m.container_path] ?? [], source, destination, propagation, field)];
  });
  const plan: CriMountPlan = { mounts: parentsFirst(planned), destinations: seen };
  // The spec's own values (no "r" prefix): the runtime applies root propagation recursively.
  if (needsShared) plan.rootfsPropagation = 'shared';
  else if (needsSlave) plan.rootfsPropagation = 'slave';
  return plan;
}

/**
 * A read-only (not recursively) volume's host submounts, bound again writable over the read-only
 * bind: the guest sees them as directories of the volume's one virtio-fs mount, and the host
 * mount's own flags still decide what a write there may do.
 */
function submountBinds(relPaths: readonly string[], source: string, destination: string, propagation: string, field: string): OciMount[] {
  return relPaths.map((rel) => {
    if (rel === '' || rel.startsWith('/') || rel.includes('\0') || rel.split('/').includes('..')) {
      throw fieldError('OCI_MOUNT_PATH_INVALID', `${field}.host_path`, `has a submount "${rel}" that is not a relative path without ".."`);
    }
    const sub = normalisePath(rel);
    return {
      destination: normalisePath(`${destination}${sub}`),
      type: 'bind',
      source: `${source}${sub}`,
      options: ['rbind', propagation, 'rw'],
    };
  });
}

/** The pod's /dev/shm, shared by every container of the pod (it is the pod's IPC namespace's). */
export function shmMount(guest: OciGuestLayout): OciMount {
  return { destination: '/dev/shm', type: 'bind', source: guest.shmPath, options: ['rbind', 'rprivate', 'nosuid', 'nodev', 'noexec'] };
}
