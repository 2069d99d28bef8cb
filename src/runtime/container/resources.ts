import { precondition } from '../../common/errors.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { KubernetesResources__Output } from '../../generated/runtime/v1/KubernetesResources.js';
import type { UpdateContainerResourcesRequest__Output } from '../../generated/runtime/v1/UpdateContainerResourcesRequest.js';
import type { UpdatePodSandboxResourcesRequest__Output } from '../../generated/runtime/v1/UpdatePodSandboxResourcesRequest.js';
import type { PodSandboxConfigInput } from '../../sizing/input.js';
import { planSizing } from '../../sizing/shape.js';
import type { HostCapacity } from '../../sizing/types.js';
import { type AnnouncedPodResources, containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import type { LiveSandbox, SandboxManager } from '../sandbox/manager.js';
import { applyResize, planResize, type ResizePlan } from '../sandbox/resize.js';
import type { RecordStore } from '../store.js';
import type { ContainerManager } from './manager.js';
import type { ContainerRecord } from './record.js';
import { announcedOf, budgetForShape } from './shape.js';

export interface ResizeDeps {
  config: KataConfig;
  host: HostCapacity;
  sandboxes: SandboxManager;
  containers: ContainerManager;
  store: RecordStore<ContainerRecord>;
}

/**
 * In-place resize (KEP-1287) of a pod VM. The new pod configuration is sized with the very planner
 * RunPodSandbox used; the VM grows by CPU hot-plug and virtio-mem within the headroom planned at
 * boot (or shrinks its memory), the VMM's cgroup follows, and the announced resources are updated
 * so later CreateContainer admissions compare against the new truth.
 */
export class ResizeService {
  constructor(private readonly deps: ResizeDeps) {}

  async updateContainer(req: UpdateContainerResourcesRequest__Output, ctx: RequestContext): Promise<void> {
    const container = this.deps.containers.resolve(req.container_id);
    const live = this.deps.sandboxes.resolve(container.sandboxId);
    ctx.annotate({ containerId: container.id, sandboxId: live.record.id });
    await this.deps.sandboxes.locks.run(live.record.id, async () => {
      requireRunning(live);
      const config = {
        ...container.config,
        ...(req.linux === null ? {} : { linux: { ...(container.config.linux as object | null), resources: req.linux } }),
        ...(req.kubernetes_resources === null ? {} : { kubernetes_resources: req.kubernetes_resources }),
      };
      const announced = announcedOf(live.record);
      let nextPodConfig: Record<string, unknown> | undefined;
      let plan: ResizePlan | undefined;
      if (announced !== undefined && req.kubernetes_resources !== null) {
        nextPodConfig = {
          ...live.record.podConfig,
          pod_resources: withContainerResources(announced, container.metadata.name, req.kubernetes_resources),
        };
        plan = this.replan(live, nextPodConfig);
      } else {
        const others = this.deps.containers
          .inSandbox(live.record.id)
          .filter((c) => c.id !== container.id && c.state === 'CONTAINER_CREATED');
        plan = this.deps.containers.growthFor(
          live,
          containerDemand(config as never),
          others.map((c) => c.demand),
          container.metadata.name,
        );
      }
      if (plan?.changed) await applyResize(live, plan, (p) => this.deps.sandboxes.cgroupsFor(p), ctx.logger);
      if (nextPodConfig !== undefined) live.record.podConfig = nextPodConfig;
      container.config = config;
      container.demand = containerDemand(config as never);
      await this.deps.sandboxes.save(live);
      await this.deps.store.put(container);
    });
  }

  async updatePodSandbox(req: UpdatePodSandboxResourcesRequest__Output, ctx: RequestContext): Promise<void> {
    const live = this.deps.sandboxes.resolve(req.pod_sandbox_id);
    ctx.annotate({ sandboxId: live.record.id });
    await this.deps.sandboxes.locks.run(live.record.id, async () => {
      requireRunning(live);
      const podConfig = live.record.podConfig;
      const linux = (podConfig.linux ?? {}) as Record<string, unknown>;
      const next: Record<string, unknown> = {
        ...podConfig,
        linux: {
          ...linux,
          ...(req.resources === null ? {} : { resources: req.resources }),
          ...(req.overhead === null ? {} : { overhead: req.overhead }),
        },
        ...(req.pod_resources !== null && req.pod_resources.containers.length > 0 ? { pod_resources: req.pod_resources } : {}),
      };
      const plan = this.replan(live, next);
      if (plan.changed) await applyResize(live, plan, (p) => this.deps.sandboxes.cgroupsFor(p), ctx.logger);
      live.record.podConfig = next;
      await this.deps.sandboxes.save(live);
    });
  }

  /** Size `podConfig` as RunPodSandbox would and decide the resize to reach it. */
  private replan(live: LiveSandbox, podConfig: Record<string, unknown>): ResizePlan {
    const handler = resolveHandler(this.deps.config, live.record.handler);
    const sizing = planSizing({ config: podConfig as PodSandboxConfigInput, handler, host: this.deps.host });
    const target = { vcpus: sizing.vm.vcpus, memoryMiB: sizing.vm.memoryMiB };
    const plan = planResize(live.record, { ...target, budget: budgetForShape(live.record, target, sizing.workload.cpuRequestMillicores) });
    // Limits follow what the VM really has after the resize (vCPUs never shrink).
    plan.budget = budgetForShape(live.record, plan.shape, sizing.workload.cpuRequestMillicores);
    return plan;
  }
}

function requireRunning(live: LiveSandbox): void {
  if (live.record.state !== 'SANDBOX_READY' || live.vm === undefined) {
    throw precondition('SANDBOX_NOT_READY', `pod sandbox ${live.record.id} is not ready; only a running VM can be resized`);
  }
}

/** The announced pod resources with one container's Kubernetes resources replaced. */
function withContainerResources(
  announced: AnnouncedPodResources,
  name: string,
  resources: KubernetesResources__Output,
): AnnouncedPodResources {
  return {
    ...announced,
    containers: (announced.containers ?? []).map((c) => (c.name === name ? { ...c, kubernetes_resources: resources } : c)),
  };
}
