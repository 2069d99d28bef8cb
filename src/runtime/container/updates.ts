import { errorMessage, precondition } from '../../common/errors.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import { resolveResources } from '../../oci/resources.js';
import type { OciResources } from '../../oci/spec-types.js';
import { planSizing } from '../../sizing/shape.js';
import type { HostCapacity } from '../../sizing/types.js';
import { containerDemand } from '../admission/index.js';
import type { RequestContext } from '../context.js';
import { applyResize, resizeCheckpoint, revertResize } from '../resize/apply.js';
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
      // The container's own limits in the guest follow the VM's size in the order a resize needs:
      // the VM grows before a limit is raised, a limit is lowered before the VM shrinks, so the
      // container never holds more than the VM has.
      const guestLimits = req.linux === null ? undefined : guestResources(req.linux);
      const shrinking = plan?.changed === true && plan.shape.memoryMiB < sandbox.record.shape.memoryMiB;
      const before = resizeCheckpoint(sandbox);
      const previousLimits = container.guest?.ociSpec.linux?.resources;
      if (guestLimits !== undefined && shrinking) await this.applyInGuest(sandbox, container, guestLimits, ctx);
      if (plan?.changed) {
        try {
          await applyResize(sandbox, plan, ctx.logger);
        } catch (err) {
          // The VM kept its size: the container gets its limits back (best effort, logged).
          if (guestLimits !== undefined && shrinking && previousLimits !== undefined) {
            const { devices: _devices, ...old } = previousLimits;
            await this.applyInGuest(sandbox, container, old, ctx).catch((e: unknown) =>
              ctx.logger.error(
                { containerId: container.id, err: errorMessage(e) },
                "rollback step failed: the container's limits in the guest not set back",
              ),
            );
          }
          throw err;
        }
      }
      if (guestLimits !== undefined && !shrinking) {
        try {
          await this.applyInGuest(sandbox, container, guestLimits, ctx);
        } catch (err) {
          if (plan?.changed) await revertResize(sandbox, before, ctx.logger);
          throw err;
        }
      }
      if (guestLimits !== undefined && container.guest !== null && container.guest !== undefined) {
        // A container not yet started in the guest gets its limits from this spec when it starts.
        const linux = container.guest.ociSpec.linux ?? {};
        const devices = linux.resources?.devices;
        container.guest.ociSpec = {
          ...container.guest.ociSpec,
          linux: { ...linux, resources: { ...(devices === undefined ? {} : { devices }), ...guestLimits } },
        };
      }
      if (nextSandboxSpec !== undefined) sandbox.record.spec = nextSandboxSpec;
      container.spec = spec;
      container.demand = containerDemand(spec);
      await sandbox.persist();
      await this.deps.store.put(container);
    });
  }

  /** A running container's guest cgroup gets `resources` (the agent's UpdateContainer); others have none yet. */
  private async applyInGuest(
    sandbox: SandboxHandle,
    container: ContainerRecord,
    resources: OciResources,
    ctx: RequestContext,
  ): Promise<void> {
    if (container.state === 'CONTAINER_RUNNING') {
      if (sandbox.agent === undefined) {
        throw precondition(
          'SANDBOX_NOT_READY',
          `pod sandbox ${sandbox.record.id} has no agent connected; container ${container.id} cannot be updated`,
        );
      }
      await sandbox.agent.updateContainer(container.id, resources, { timeoutMs: UPDATE_CALL_MS });
      ctx.logger.info({ containerId: container.id, resources }, "the container's limits changed in the guest");
    }
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

/** One UpdateContainer call in the guest. */
const UPDATE_CALL_MS = 30_000;

/** The OCI resources the guest's runtime applies for `linux` (CPU and memory; an update never changes devices). */
function guestResources(linux: NonNullable<ContainerResourceUpdate['linux']>): Omit<OciResources, 'devices'> {
  return resolveResources(linux);
}
