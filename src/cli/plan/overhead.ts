/**
 * `kata-ts plan --overhead`: the RuntimeClass for a handler, with `overhead.podFixed` computed
 * from the handler's config (pure): everything a pod costs on the host beyond its containers'
 * limits. Inside the VM that is the guest's own overhead (`guestOverhead`, added to the VM's
 * size); outside it, the VMM (`vmmOverhead`), QEMU's translation cache under TCG
 * (`hypervisor.tcgTranslationCacheMiB`) and the free-page-reporting balloon. The kubelet limits
 * the pod's cgroup, the VMM's parent, to the containers' limits plus podFixed, so anything less
 * lets the VM be OOM-killed before its containers reach their limits. It sends podFixed back as
 * `LinuxPodSandboxConfig.overhead`, which sizing (src/sizing/sources.ts `resolveVmmOverhead`)
 * reads as covering those same parts. deploy/runtimeclass-<handler>.yaml hold this output for the
 * default config.
 */
import { stringify } from 'yaml';
import type { KataConfig } from '../../config/types.js';
import { BALLOON_DEVICE_MIB } from '../../hypervisor/argv.js';

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
  const { guestOverhead: guest, vmmOverhead: vmm } = profile;
  const cacheMiB = accel === 'kvm' ? 0 : config.hypervisor.tcgTranslationCacheMiB;
  const balloonMiB = profile.vm.freePageReporting && !profile.confidential ? BALLOON_DEVICE_MIB : 0;
  const why =
    accel === 'any'
      ? 'acceleration auto: nodes without usable KVM run TCG'
      : `acceleration ${accel}${accel === 'tcg' ? '' : ': no translation cache'}`;
  const memoryTerms = [
    `guestOverhead.memoryMiB ${guest.memoryMiB}`,
    `vmmOverhead.memoryMiB ${vmm.memoryMiB}`,
    ...(cacheMiB > 0 ? [`hypervisor.tcgTranslationCacheMiB ${cacheMiB}`] : []),
    ...(balloonMiB > 0 ? [`free-page-reporting balloon ${balloonMiB}`] : []),
  ];
  return {
    handler,
    description: profile.description,
    cpuMillicores: guest.cpuMillicores + vmm.cpuMillicores,
    memoryMiB: guest.memoryMiB + vmm.memoryMiB + cacheMiB + balloonMiB,
    terms: {
      cpu: `guestOverhead.cpuMillicores ${guest.cpuMillicores} + vmmOverhead.cpuMillicores ${vmm.cpuMillicores}`,
      memory: `${memoryTerms.join(' + ')} (${why})`,
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
    "overhead.podFixed is what the pod costs on the host beyond its containers' limits: the guest's own",
    'kernel and agent inside the VM, and the VMM (QEMU and its devices) outside it:',
    `  cpu ${o.cpuMillicores}m = ${o.terms.cpu}`,
    `  memory ${o.memoryMiB}Mi = ${o.terms.memory}`,
    "The kubelet adds it to the pod's cgroup, the VMM's parent, so the VM fits under the pod's limit,",
    'and sends it as LinuxPodSandboxConfig.overhead. Nodes are selected by the label the installer',
    'DaemonSet sets.',
  ]
    .map((l) => `# ${l}`.trimEnd())
    .join('\n');
  return `${comment}\n${stringify(runtimeClassObject(o), { lineWidth: 0 })}`;
}
