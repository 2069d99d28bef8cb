/**
 * The runtime's template planners (pure; docs/templates.md, "Pods from a template"): a handler's
 * template VM is its pooled VM (src/runtime/pool/plan.ts) with the boot RAM in a file, so a clone
 * is grown into a pod by the pool claim's steps; whether a pod can start as a clone, and when not,
 * why (the reason goes into its status, and the pod falls back to the pool or a cold boot).
 */
import type { TemplateVmSpec } from '../../hypervisor/template.js';
import type { VmShape } from '../../sizing/types.js';
import type { SandboxPlan } from '../plan.js';
import { type PoolKey, type PoolVmPlanInput, planPoolVm, planPoolVmSpec, poolMiss, poolPortArgs } from '../pool/plan.js';

/** Why a pod does not start as a clone (with the fit's own reason inside TEMPLATE_NO_FIT's message). */
export type TemplateMissReason =
  | 'TEMPLATE_DISABLED'
  | 'TEMPLATE_NO_FIT'
  | 'TEMPLATE_NOT_READY'
  | 'TEMPLATE_BUILD_FAILED'
  | 'TEMPLATE_CLONE_FAILED'
  | 'TEMPLATE_CLAIM_FAILED';

export interface TemplateMiss {
  /** One of TemplateMissReason, or the code of the error a clone failed with. */
  reason: string;
  /** One sentence naming what differs or failed. */
  message: string;
}

export interface TemplateVmPlan {
  spec: TemplateVmSpec;
  /** The pooled VM's key for the same handler: what the pod's own plan is compared with. */
  key: PoolKey;
  shape: VmShape;
}

/**
 * Pure: the template VM of a handler: the pooled VM's argv spec without free page reporting
 * (no balloon device: QEMU 7.2 would discard into the template's RAM file), the agent required,
 * the pool's two hot-plug ports after the topology's (the clone's NIC and 9p share go there).
 */
export function planTemplateVm(input: Omit<PoolVmPlanInput, 'vmName' | 'paths'>): TemplateVmPlan {
  const { spec } = planPoolVmSpec(input);
  const { key } = planPoolVm({
    ...input,
    vmName: 'kata-ts-template-key',
    paths: { qmpSocket: '/template-key/qmp.sock', readySocket: '/template-key/ready.sock', consoleLog: '/template-key/console.log' },
  });
  // No balloon at all (validateTemplateSpec says why): a clone's freed memory is not given back.
  const { freePageReporting: _never, ...rest } = spec;
  return { spec: { ...rest, withAgent: true, hotplugPortArgs: poolPortArgs() }, key, shape: spec.shape };
}

export interface TemplateFitInput {
  plan: SandboxPlan;
  /** The handler is in templates.handlers. */
  optedIn: boolean;
  template: TemplateVmPlan;
  joinsNetns: boolean;
  withAgent: boolean;
  /** The pod's network is one kata-ts makes with CNI (null: no network, or a joined namespace). */
  cniOrNone: boolean;
}

/** Pure: null when the pod can start as a clone of its handler's template, else the first reason it cannot. */
export function templateMiss(input: TemplateFitInput): TemplateMiss | null {
  const { plan } = input;
  if (!input.optedIn) return { reason: 'TEMPLATE_DISABLED', message: `templates.handlers does not name handler "${plan.handler}"` };
  if (!input.cniOrNone) {
    return { reason: 'TEMPLATE_NO_FIT', message: "POOL_NETNS_NOT_OURS: the pod joins its caller's network namespace" };
  }
  // The pool's fit, against the template VM's key and shape (the same VM as a pooled one).
  const miss = poolMiss({
    plan,
    key: input.template.key,
    joinsNetns: input.joinsNetns,
    pooled: { key: input.template.key, shape: input.template.shape },
    poolSize: 1,
    withAgent: input.withAgent,
    vmNoun: 'the template VM',
  });
  return miss === null ? null : { reason: 'TEMPLATE_NO_FIT', message: `${miss.reason}: ${miss.message}` };
}
