/**
 * `kata-ts plan --overhead`: the RuntimeClass for a handler, with `overhead.podFixed` computed
 * from the handler's VMM budget (pure). What the host budget (src/sizing/shape.ts `planSizing`)
 * charges the VMM beyond the VM's own memory and vCPUs is the handler's `vmmOverhead` and, under
 * TCG, QEMU's translation cache (`hypervisor.tcgTranslationCacheMiB`); the kubelet adds podFixed to
 * the pod's cgroup and sends it back as `LinuxPodSandboxConfig.overhead`, which sizing takes as
 * the VMM's overhead. deploy/runtimeclass-<handler>.yaml hold this output for the default config.
 */
import { stringify } from 'yaml';
import type { KataConfig } from '../../config/types.js';

/** Which accelerations the RuntimeClass must cover: a RuntimeClass applies to every node it selects. */
export type OverheadAccel = 'kvm' | 'tcg' | 'any';

export interface RuntimeClassOverhead {
  handler: string;
  description: string;
  cpuMillicores: number;
  memoryMiB: number;
  /** One line per term of the sum, for the comment. */
  terms: { cpu: string; memory: string };
}

/** The accelerations to cover when none is asked for: the config's setting, or both for `auto`. */
export function defaultOverheadAccel(config: KataConfig): OverheadAccel {
  const a = config.hypervisor.acceleration;
  return a === 'kvm' ? 'kvm' : a === 'tcg' ? 'tcg' : 'any';
}

export function runtimeClassOverhead(config: KataConfig, handler: string, accel: OverheadAccel): RuntimeClassOverhead {
  const profile = config.handlers[handler]!;
  const vmm = profile.vmmOverhead;
  const cacheMiB = accel === 'kvm' ? 0 : config.hypervisor.tcgTranslationCacheMiB;
  const why =
    accel === 'any'
      ? 'acceleration auto: nodes without usable KVM run TCG'
      : `acceleration ${accel}${accel === 'tcg' ? '' : ': no translation cache'}`;
  return {
    handler,
    description: profile.description,
    cpuMillicores: vmm.cpuMillicores,
    memoryMiB: vmm.memoryMiB + cacheMiB,
    terms: {
      cpu: `vmmOverhead.cpuMillicores ${vmm.cpuMillicores}`,
      memory:
        cacheMiB > 0
          ? `vmmOverhead.memoryMiB ${vmm.memoryMiB} + hypervisor.tcgTranslationCacheMiB ${cacheMiB} (${why})`
          : `vmmOverhead.memoryMiB ${vmm.memoryMiB} (${why})`,
    },
  };
}

/** The label the installer's DaemonSet puts on nodes it installed kata-ts on (deploy/kata-ts-deploy.yaml). */
export const RUNTIME_NODE_LABEL = 'kata-ts.dev/runtime';

export function runtimeClassObject(o: RuntimeClassOverhead): Record<string, unknown> {
  return {
    apiVersion: 'node.k8s.io/v1',
    kind: 'RuntimeClass',
    metadata: { name: o.handler },
    handler: o.handler,
    overhead: { podFixed: { cpu: `${o.cpuMillicores}m`, memory: `${o.memoryMiB}Mi` } },
    scheduling: { nodeSelector: { [RUNTIME_NODE_LABEL]: 'true' } },
  };
}

/** One RuntimeClass as YAML, with a comment saying where each number comes from. */
export function runtimeClassYaml(o: RuntimeClassOverhead): string {
  const comment = [
    `RuntimeClass for the ${o.handler} handler, printed by \`kata-ts plan --overhead --handler ${o.handler}\``,
    `(deploy/runtimeclass-${o.handler}.yaml holds exactly this for the default config).`,
    `${o.description}.`,
    "overhead.podFixed is what the VMM costs on the host beyond the VM's own memory and vCPUs:",
    `  cpu ${o.cpuMillicores}m = ${o.terms.cpu}`,
    `  memory ${o.memoryMiB}Mi = ${o.terms.memory}`,
    "The kubelet adds it to the pod's cgroup and sends it as LinuxPodSandboxConfig.overhead, the",
    "VMM's budget in kata-ts's sizing. Nodes are selected by the label the installer DaemonSet sets.",
  ]
    .map((l) => `# ${l}`.trimEnd())
    .join('\n');
  return `${comment}\n${stringify(runtimeClassObject(o), { lineWidth: 0 })}`;
}
