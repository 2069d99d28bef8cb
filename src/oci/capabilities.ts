/**
 * Capabilities: the default set every container runtime in Kubernetes grants (the list Docker and
 * containerd document), "ALL" in add or drop, and privileged containers. Pure.
 */
import type { OciContainerSecurityInput } from './input.js';
import { fieldError } from './process.js';
import type { OciCapabilities } from './spec-types.js';

/** Every capability Linux 6.1 (the guest kernel) knows, in number order (CAP_CHOWN = 0). */
export const ALL_CAPABILITIES: readonly string[] = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_DAC_READ_SEARCH',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_KILL',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETPCAP',
  'CAP_LINUX_IMMUTABLE',
  'CAP_NET_BIND_SERVICE',
  'CAP_NET_BROADCAST',
  'CAP_NET_ADMIN',
  'CAP_NET_RAW',
  'CAP_IPC_LOCK',
  'CAP_IPC_OWNER',
  'CAP_SYS_MODULE',
  'CAP_SYS_RAWIO',
  'CAP_SYS_CHROOT',
  'CAP_SYS_PTRACE',
  'CAP_SYS_PACCT',
  'CAP_SYS_ADMIN',
  'CAP_SYS_BOOT',
  'CAP_SYS_NICE',
  'CAP_SYS_RESOURCE',
  'CAP_SYS_TIME',
  'CAP_SYS_TTY_CONFIG',
  'CAP_MKNOD',
  'CAP_LEASE',
  'CAP_AUDIT_WRITE',
  'CAP_AUDIT_CONTROL',
  'CAP_SETFCAP',
  'CAP_MAC_OVERRIDE',
  'CAP_MAC_ADMIN',
  'CAP_SYSLOG',
  'CAP_WAKE_ALARM',
  'CAP_BLOCK_SUSPEND',
  'CAP_AUDIT_READ',
  'CAP_PERFMON',
  'CAP_BPF',
  'CAP_CHECKPOINT_RESTORE',
];

/** The default set (Docker's and containerd's documented defaults), in number order. */
export const DEFAULT_CAPABILITIES: readonly string[] = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_KILL',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_NET_RAW',
  'CAP_SYS_CHROOT',
  'CAP_MKNOD',
  'CAP_AUDIT_WRITE',
  'CAP_SETFCAP',
];

/** `net_admin`, `NET_ADMIN` and `CAP_NET_ADMIN` all name CAP_NET_ADMIN; "ALL" stays "ALL". */
function normalise(name: string, field: string): string {
  const upper = name.trim().toUpperCase();
  if (upper === 'ALL') return upper;
  const full = upper.startsWith('CAP_') ? upper : `CAP_${upper}`;
  if (!ALL_CAPABILITIES.includes(full))
    throw fieldError('OCI_CAPABILITY_UNKNOWN', field, `names "${name}", which is not a Linux capability`);
  return full;
}

const inOrder = (set: ReadonlySet<string>): string[] => ALL_CAPABILITIES.filter((c) => set.has(c));

/**
 * The capability sets. Start from the default set; "ALL" in add grants every capability, "ALL"
 * in drop empties the set; then the named adds are granted and the named drops removed (a name in
 * both lists ends up dropped). Privileged containers get every capability whatever the lists
 * say. The inheritable set stays empty (a program run through a file capability must not pick
 * up more than it asked for) except for ambient capabilities, which Linux requires there too.
 */
export function resolveCapabilities(security: OciContainerSecurityInput | null | undefined): Required<OciCapabilities> {
  const field = 'container.linux.security_context.capabilities';
  const caps = security?.capabilities ?? null;
  const add = (caps?.add_capabilities ?? []).map((c, i) => normalise(c, `${field}.add_capabilities[${i}]`));
  const drop = (caps?.drop_capabilities ?? []).map((c, i) => normalise(c, `${field}.drop_capabilities[${i}]`));
  const ambient = (caps?.add_ambient_capabilities ?? []).map((c, i) => normalise(c, `${field}.add_ambient_capabilities[${i}]`));
  if (ambient.includes('ALL')) throw fieldError('OCI_CAPABILITY_UNKNOWN', `${field}.add_ambient_capabilities`, 'may not contain "ALL"');

  let set: Set<string>;
  if (security?.privileged === true) set = new Set(ALL_CAPABILITIES);
  else {
    set = new Set(DEFAULT_CAPABILITIES);
    if (add.includes('ALL')) set = new Set(ALL_CAPABILITIES);
    if (drop.includes('ALL')) set.clear();
    for (const c of add) if (c !== 'ALL') set.add(c);
    for (const c of drop) if (c !== 'ALL') set.delete(c);
  }
  ambient.forEach((c, i) => {
    if (!set.has(c))
      throw fieldError(
        'OCI_AMBIENT_NOT_GRANTED',
        `${field}.add_ambient_capabilities[${i}]`,
        `names ${c}, which the container is not granted`,
      );
  });
  const ambientSet = new Set(ambient);
  const granted = inOrder(set);
  return {
    bounding: granted,
    effective: granted,
    permitted: granted,
    inheritable: inOrder(ambientSet),
    ambient: inOrder(ambientSet),
  };
}
