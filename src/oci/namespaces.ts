/**
 * Namespaces and sysctls of a container in a pod VM. Pure.
 *
 * - network: every container joins the pod's network namespace (`guest.namespaces.network`, the
 *   guest namespace the VM's NIC lives in). NODE (host network) is refused: the host's network
 *   is outside the VM.
 * - IPC and UTS: always the pod's. NODE IPC is refused for the same reason.
 * - PID: POD joins the pod's PID namespace, CONTAINER gets a new one, TARGET joins the target
 *   container's. NODE maps to the guest's root PID namespace: the container sees the guest
 *   agent and every container of this pod, never a host process (the VM is the node it can see).
 * - mount and cgroup: always new.
 * - user: only NODE (no user namespace) is offered; POD is refused.
 */
import type { OciContainerInput, OciGuestLayout, OciNamespaceOptionsInput, OciSandboxInput } from './input.js';
import { fieldError } from './process.js';
import type { OciNamespace } from './spec-types.js';

const CNS = 'container.linux.security_context.namespace_options';
const SNS = 'sandbox.linux.security_context.namespace_options';

function refuseNode(opts: OciNamespaceOptionsInput | null | undefined, prefix: string): void {
  if (opts?.network === 'NODE') {
    throw fieldError(
      'OCI_HOST_NETWORK_UNSUPPORTED',
      `${prefix}.network`,
      "is NODE, but the host's network namespace is outside the pod VM",
    );
  }
  if (opts?.ipc === 'NODE') {
    throw fieldError('OCI_HOST_IPC_UNSUPPORTED', `${prefix}.ipc`, "is NODE, but the host's IPC namespace is outside the pod VM");
  }
  const userns = opts?.userns_options?.mode;
  if (userns !== undefined && userns !== 'NODE') {
    throw fieldError(
      'OCI_USER_NAMESPACE_UNSUPPORTED',
      `${prefix}.userns_options.mode`,
      `is ${userns}; only NODE (no user namespace) is offered`,
    );
  }
}

/** The namespace list, in a fixed order so that equal inputs give byte-identical specs. */
export function resolveNamespaces(container: OciContainerInput, sandbox: OciSandboxInput, guest: OciGuestLayout): OciNamespace[] {
  const copts = container.linux?.security_context?.namespace_options;
  const sopts = sandbox.linux?.security_context?.namespace_options;
  refuseNode(sopts, SNS);
  refuseNode(copts, CNS);
  const out: OciNamespace[] = [];
  // Unset is POD, the CRI enum's zero value (the kubelet always says CONTAINER when it means it).
  const pidMode = copts?.pid ?? 'POD';
  switch (pidMode) {
    case 'POD':
      out.push({ type: 'pid', path: guest.namespaces.pid });
      break;
    case 'CONTAINER':
      out.push({ type: 'pid' });
      break;
    case 'TARGET':
      if (guest.targetPidNamespace === undefined || guest.targetPidNamespace === '') {
        throw fieldError(
          'OCI_TARGET_NAMESPACE_UNKNOWN',
          `${CNS}.target_id`,
          `names "${copts?.target_id ?? ''}", whose PID namespace was not provided`,
        );
      }
      out.push({ type: 'pid', path: guest.targetPidNamespace });
      break;
    case 'NODE':
      break; // the guest's root PID namespace: no entry means the runtime's own
  }
  out.push({ type: 'ipc', path: guest.namespaces.ipc });
  out.push({ type: 'uts', path: guest.namespaces.uts });
  out.push({ type: 'mount' });
  out.push({ type: 'network', path: guest.namespaces.network });
  out.push({ type: 'cgroup' });
  return out;
}

/**
 * The IPC sysctls (exactly the ones the IPC namespace owns and crun accepts; Kubernetes writes
 * them as kernel.shm*, kernel.msg*, kernel.sem) and the prefixes of the other namespaced ones.
 */
const NAMESPACED_EXACT = [
  'kernel.shmall',
  'kernel.shmmax',
  'kernel.shmmni',
  'kernel.shm_rmid_forced',
  'kernel.msgmax',
  'kernel.msgmnb',
  'kernel.msgmni',
  'kernel.sem',
];
const NAMESPACED_PREFIXES = ['fs.mqueue.', 'net.'];

/**
 * The pod's sysctls, which every container of it carries (they act on the shared IPC and network
 * namespaces, so writing them again is harmless). Names may use `/` as the separator, as
 * Kubernetes allows; only namespaced sysctls are accepted, others would change the whole guest.
 */
export function resolveSysctls(sandbox: OciSandboxInput): Record<string, string> | undefined {
  const given = sandbox.linux?.sysctls ?? {};
  const keys = Object.keys(given).sort();
  if (keys.length === 0) return undefined;
  const out: Record<string, string> = {};
  for (const key of keys) {
    const dotted = key.includes('.') ? key : key.replaceAll('/', '.');
    const ok = NAMESPACED_EXACT.includes(dotted) || NAMESPACED_PREFIXES.some((p) => dotted.startsWith(p));
    if (!ok || /[\s\0]/.test(key)) {
      throw fieldError(
        'OCI_SYSCTL_NOT_NAMESPACED',
        `sandbox.linux.sysctls["${key}"]`,
        'is not a namespaced sysctl (kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*, net.*)',
      );
    }
    out[key] = given[key]!;
  }
  return out;
}
