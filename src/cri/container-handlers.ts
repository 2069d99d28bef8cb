import type { ContainerStatsRequest__Output } from '../generated/runtime/v1/ContainerStatsRequest.js';
import type { ContainerStatsResponse } from '../generated/runtime/v1/ContainerStatsResponse.js';
import type { ContainerStatusRequest__Output } from '../generated/runtime/v1/ContainerStatusRequest.js';
import type { ContainerStatusResponse } from '../generated/runtime/v1/ContainerStatusResponse.js';
import type { CreateContainerRequest__Output } from '../generated/runtime/v1/CreateContainerRequest.js';
import type { CreateContainerResponse } from '../generated/runtime/v1/CreateContainerResponse.js';
import type { ExecSyncRequest__Output } from '../generated/runtime/v1/ExecSyncRequest.js';
import type { ExecSyncResponse } from '../generated/runtime/v1/ExecSyncResponse.js';
import type { ListContainerStatsRequest__Output } from '../generated/runtime/v1/ListContainerStatsRequest.js';
import type { ListContainerStatsResponse } from '../generated/runtime/v1/ListContainerStatsResponse.js';
import type { ListContainersRequest__Output } from '../generated/runtime/v1/ListContainersRequest.js';
import type { ListContainersResponse } from '../generated/runtime/v1/ListContainersResponse.js';
import type { PodSandboxStatus } from '../generated/runtime/v1/PodSandboxStatus.js';
import type { RemoveContainerRequest__Output } from '../generated/runtime/v1/RemoveContainerRequest.js';
import type { ReopenContainerLogRequest__Output } from '../generated/runtime/v1/ReopenContainerLogRequest.js';
import type { StartContainerRequest__Output } from '../generated/runtime/v1/StartContainerRequest.js';
import type { StopContainerRequest__Output } from '../generated/runtime/v1/StopContainerRequest.js';
import type { UpdateContainerResourcesRequest__Output } from '../generated/runtime/v1/UpdateContainerResourcesRequest.js';
import type { UpdatePodSandboxResourcesRequest__Output } from '../generated/runtime/v1/UpdatePodSandboxResourcesRequest.js';
import type { ContainerManager } from '../runtime/container/manager.js';
import type { StatsCollector } from '../runtime/container/stats-service.js';
import type { ResourceUpdates } from '../runtime/container/updates.js';
import {
  decodeContainerFilter,
  decodeContainerResourceUpdate,
  decodeContainerStatsFilter,
  decodeCreateContainer,
} from './decode/container.js';
import { decodeSandboxResourceUpdate } from './decode/sandbox.js';
import type { RuntimeRpcHandlers, RuntimeStreamHandlers } from './rpcs.js';
import type { CallContext } from './server.js';
import { containerStatusView, containerView } from './views/container.js';
import { criContainerStats } from './views/stats.js';

/**
 * Thin CRI handlers over the ContainerManager and ResourceUpdates, each checked against its rpc
 * in the generated RuntimeService (a misspelled name does not compile).
 */
export function containerHandlers(containers: ContainerManager, resize: ResourceUpdates, stats: StatsCollector) {
  return {
    CreateContainer: async (req: CreateContainerRequest__Output, ctx: CallContext): Promise<CreateContainerResponse> => {
      const { sandboxId, spec } = decodeCreateContainer(req);
      return { container_id: await containers.create(sandboxId, spec, ctx) };
    },
    StartContainer: async (req: StartContainerRequest__Output, ctx: CallContext) => {
      await containers.start(req.container_id, ctx);
      return {};
    },
    StopContainer: async (req: StopContainerRequest__Output, ctx: CallContext) => {
      await containers.stop(req.container_id, Number(req.timeout), ctx);
      return {};
    },
    ExecSync: async (req: ExecSyncRequest__Output, ctx: CallContext): Promise<ExecSyncResponse> => {
      const result = await containers.execSync(req.container_id, req.cmd, Number(req.timeout), ctx);
      return { stdout: result.stdout, stderr: result.stderr, exit_code: result.exitCode };
    },
    ReopenContainerLog: async (req: ReopenContainerLogRequest__Output) => {
      await containers.reopenLog(req.container_id);
      return {};
    },
    ContainerStats: async (req: ContainerStatsRequest__Output): Promise<ContainerStatsResponse> => {
      const [one] = await stats.forContainers([containers.resolve(req.container_id)]);
      return { stats: one === undefined ? null : criContainerStats(one) };
    },
    ListContainerStats: async (req: ListContainerStatsRequest__Output): Promise<ListContainerStatsResponse> => ({
      stats: (await stats.list(decodeContainerStatsFilter(req))).map(criContainerStats),
    }),
    RemoveContainer: async (req: RemoveContainerRequest__Output, ctx: CallContext) => {
      await containers.remove(req.container_id, ctx);
      return {};
    },
    ContainerStatus: async (req: ContainerStatusRequest__Output, ctx: CallContext): Promise<ContainerStatusResponse> => {
      const record = containers.resolve(req.container_id);
      ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
      return {
        status: containerStatusView(record),
        info: req.verbose
          ? {
              info: JSON.stringify({
                sandboxId: record.sandboxId,
                rootfs: record.rootfs,
                devices: record.devices,
                demand: record.demand,
                image: record.image,
              }),
            }
          : {},
      };
    },
    ListContainers: async (req: ListContainersRequest__Output): Promise<ListContainersResponse> => ({
      containers: containers.list(decodeContainerFilter(req)).map(containerView),
    }),
    UpdateContainerResources: async (req: UpdateContainerResourcesRequest__Output, ctx: CallContext) => {
      const { containerId, update } = decodeContainerResourceUpdate(req);
      await resize.updateContainer(containerId, update, ctx);
      return {};
    },
    UpdatePodSandboxResources: async (req: UpdatePodSandboxResourcesRequest__Output, ctx: CallContext) => {
      const { sandboxId, update } = decodeSandboxResourceUpdate(req);
      await resize.updatePodSandbox(sandboxId, update, ctx);
      return {};
    },
  } satisfies Partial<RuntimeRpcHandlers>;
}

/**
 * GetContainerEvents: every container event from the moment the client subscribed until it goes
 * away, with the container's status (and the pod's, when the pod still exists).
 */
export function containerStreamHandlers(
  containers: ContainerManager,
  podStatus: (sandboxId: string) => PodSandboxStatus | null,
): RuntimeStreamHandlers {
  return {
    GetContainerEvents: (_req, send, ctx) =>
      new Promise<void>((resolve) => {
        const unsubscribe = containers.events.subscribe((e) => {
          send({
            container_id: e.record.id,
            container_event_type: e.type,
            created_at: e.atNs,
            pod_sandbox_status: podStatus(e.record.sandboxId),
            containers_statuses: [containerStatusView(e.record)],
          });
        });
        ctx.signal.addEventListener(
          'abort',
          () => {
            unsubscribe();
            resolve();
          },
          { once: true },
        );
      }),
  };
}
