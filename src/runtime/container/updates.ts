import { precondition } from '../../common/errors.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import { planSizing } from '../../sizing/shape.js';
import type { HostCapacity } from '../../sizing/types.js';
import { containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import { applyResize } from '../resize/apply.js';
import { budgetForShape, planResize, type ResizePlan } from '../resize/plan.js';
import type { SandboxAccess, SandboxHandle } from '../sandbox/types.js';
import type { ContainerSpec } from '../spec/container.js';
import { announcedPodResources, emptyLinuxSandboxConfig, type SandboxSpec, withContainerResources } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import type { ContainerRecord } from './record.js';
import type { ContainerLookup, ContainerResourceUpdate, SandboxResourceUpdate } from './types.js';

export interface ResourceUpdateDeps {
  config: KataConfig;
  host: HostCapacity;
  sandboxes: SandboxAccess;
  containers: ContainerLookup;
  store: RecordStore<ContainerRecord>;
}

/**
 * UpdateContainerResources and UpdatePodSandboxResources: in-place resize (KEP-1287) of a pod VM.
 * The new pod configuration is sized with the very planner RunPodSandbox used; the VM grows by
 * CPU hot-plug and virtio-mem within the headroom planned at boot (or shrinks its memory), the
 * VMM's cgroup follows, and the specs are updated so later CreateContainer admissions compare
 * against the new truth.
 */
export class ResourceUpdates {
  constructor(private readonly deps: ResourceUpdateDeps) {}

  /** UpdateContainerResources: container `containerIdOrPrefix` gets the parts of `req` that are set. */
  async updateContainer(containerIdOrPrefix: string, req: ContainerResourceUpdate, ctx: RequestContext): Promise<void> {
    const container = this.deps.containers.resolve(containerIdOrPrefix);
    ctx.annotate({ containerId: container.id, sandboxId: container.sandboxId });
    await this.deps.sandboxes.withSandbox(container.sandboxId, async (sandbox) => {
      requireRunning(sandbox);
      const spec: ContainerSpec = {
        ...container.spec,
        ...(req.linux === null
          ? {}
          : { linux: { security_context: container.spec.linux?.security_context ?? null, resources: req.linux } }),
        ...(req.kubernetes_resources === null ? {} : { kubernetes_resources: req.kubernetes_resources }),
      };
      const announced = announcedPodResources(sandbox.record.spec);
      let nextSandboxSpec: SandboxSpec | undefined;
      let plan: ResizePlan | undefined;
      if (announced !== undefined && req.kubernetes_resources !== null) {
        nextSandboxSpec = {
          ...sandbox.record.spec,
          pod_resources: withContainerResources(announced, container.metadata.name, req.kubernetes_resources),
        };
        plan = this.replan(sandbox, nextSandboxSpec);
      } else {
        const others = this.deps.containers
          .inSandbox(sandbox.record.id)
          .filter((c) => c.id !== container.id && c.state === 'CONTAINER_CREATED');
        plan = this.deps.containers.growthFor(
          sandbox.record,
          containerDemand(spec),
          others.map((c) => c.demand),
          container.metadata.name,
        );
      }
      if (plan?.changed) await applyResize(sandbox, plan, ctx.logger);
      if (nextSandboxSpec !== undefined) sandbox.record.spec = nextSandboxSpec;
      container.spec = spec;
      container.demand = containerDemand(spec);
      await sandbox.persist();
      await this.deps.store.put(container);
    });
  }

  /** UpdatePodSandboxResources: sandbox `sandboxIdOrPrefix` gets the parts of `req` that are set. */
  async updatePodSandbox(sandboxIdOrPrefix: string, req: SandboxResourceUpdate, ctx: RequestContext): Promise<void> {
    await this.deps.sandboxes.withSandbox(sandboxIdOrPrefix, async (sandbox) => {
      ctx.annotate({ sandboxId: sandbox.record.id });
      requireRunning(sandbox);
      const current = sandbox.record.spec;
      const next: SandboxSpec = {
        ...current,
        linux: {
          ...(current.linux ?? emptyLinuxSandboxConfig()),
          ...(req.resources === null ? {} : { resources: req.resources }),
          ...(req.overhead === null ? {} : { overhead: req.overhead }),
        },
        ...(req.pod_resources !== null && req.pod_resources.containers.length > 0 ? { pod_resources: req.pod_resources } : {}),
      };
      const plan = this.replan(sandbox, next);
      if (plan.changed) await applyResize(sandbox, plan, ctx.logger);
      sandbox.record.spec = next;
      await sandbox.persist();
    });
  }

  /** Size `spec` as RunPodSandbox would and decide the resize to reach it. */
  private replan(sandbox: SandboxHandle, spec: SandboxSpec): ResizePlan {
    const { record } = sandbox;
    const handler = resolveHandler(this.deps.config, record.handler);
    const sizing = planSizing({ config: spec, handler, host: this.deps.host });
    const target = { vcpus: sizing.vm.vcpus, memoryMiB: sizing.vm.memoryMiB };
    const plan = planResize(record, { ...target, budget: budgetForShape(record, target, sizing.workload.cpuRequestMillicores) });
    // Limits follow what the VM really has after the resize (vCPUs never shrink).
    plan.budget = budgetForShape(record, plan.shape, sizing.workload.cpuRequestMillicores);
    return plan;
  }
}

function requireRunning(sandbox: SandboxHandle): void {
  if (sandbox.record.state !== 'SANDBOX_READY' || sandbox.vm === undefined) {
    throw precondition('SANDBOX_NOT_READY', `pod sandbox ${sandbox.record.id} is not ready; only a running VM can be resized`);
  }
}
