/**
 * A single-container sandbox's VM (`ctr run`, `nerdctl run` with the kata-ts runtime): the task
 * containerd sees is the container, and the pod synthesized for it (decode/solo.ts) is booted
 * before it and removed after it. The sandbox and the container share the task's id, so a dead
 * shim's `delete` of that id removes the whole pod (delete.ts: the sandbox's id means the pod).
 */
import type { RequestContext } from '../runtime/context.js';
import type { SoloTask } from './decode/index.js';
import { cgroupParentForDriver, type ShimPod } from './pod.js';

export interface SoloDeps {
  pod: ShimPod;
  /** The kata-ts runtime handler (`kata-ts`, `kata-ts-cvm`). */
  handler: string;
}

/**
 * Boot the pod VM of a single-container task, sized by the sizing planner from the pod spec's
 * `linux.resources` (the container's own limits), joined to the spec's network namespace when it
 * names one, placed as its `linux.cgroupsPath` says under the pod's cgroup driver (a systemd slice
 * under cgroupfs is dropped, as for a CRI pod). A failed boot leaves nothing (the core's rollback).
 */
export async function bootSoloSandbox(deps: SoloDeps, id: string, solo: SoloTask, ctx: RequestContext): Promise<void> {
  const { pod } = deps;
  const spec = solo.pod;
  const driver = pod.facts.cgroupDriver.name;
  if (spec.linux != null) {
    const parent = cgroupParentForDriver(driver, solo.cgroup?.driver ?? null, spec.linux.cgroup_parent);
    if (parent !== spec.linux.cgroup_parent) {
      ctx.logger.warn(
        { cgroupsPath: solo.cgroup?.cgroupsPath, driver },
        'the container names a systemd slice under the cgroupfs driver: the VMM goes to the cgroupfs root',
      );
      spec.linux.cgroup_parent = parent;
    }
  }
  await pod.sandboxes.run(spec, deps.handler, ctx, { id, ...(solo.netnsPath === null ? {} : { joinNetns: solo.netnsPath }) });
  ctx.logger.info({ sandboxId: id, netns: solo.netnsPath, vmPid: pod.sandboxes.find(id)?.vm?.pid }, 'single-container sandbox booted');
}

/** The single-container task's VM stopped and removed with everything it holds (its container is removed first by the caller). */
export async function removeSoloSandbox(deps: SoloDeps, id: string, ctx: RequestContext): Promise<void> {
  await deps.pod.sandboxes.remove(id, ctx);
}
