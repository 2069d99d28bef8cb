import type { ContainerStatus } from '../../generated/runtime/v1/ContainerStatus.js';
import type { ListPodSandboxRequest__Output } from '../../generated/runtime/v1/ListPodSandboxRequest.js';
import type { ListPodSandboxResponse } from '../../generated/runtime/v1/ListPodSandboxResponse.js';
import type { PodSandboxStatusRequest__Output } from '../../generated/runtime/v1/PodSandboxStatusRequest.js';
import type { PodSandboxStatusResponse } from '../../generated/runtime/v1/PodSandboxStatusResponse.js';
import type { RemovePodSandboxRequest__Output } from '../../generated/runtime/v1/RemovePodSandboxRequest.js';
import type { RunPodSandboxRequest__Output } from '../../generated/runtime/v1/RunPodSandboxRequest.js';
import type { RunPodSandboxResponse } from '../../generated/runtime/v1/RunPodSandboxResponse.js';
import type { StopPodSandboxRequest__Output } from '../../generated/runtime/v1/StopPodSandboxRequest.js';
import { sandboxVerboseInfo } from '../sandbox/info.js';
import type { LiveSandbox, SandboxManager } from '../sandbox/manager.js';
import { nowNs } from '../sandbox/record.js';
import { podSandboxStatusView, podSandboxView } from '../sandbox/views.js';
import type { RuntimeRpcHandlers } from './rpcs.js';
import type { CallContext } from './server.js';

/** Container statuses for PodSandboxStatus (evented PLEG); supplied by the container layer. */
export type SandboxContainerStatuses = (live: LiveSandbox) => ContainerStatus[];

/**
 * Thin CRI handlers over the SandboxManager: decode nothing, decide nothing, map shapes. Each is
 * checked against its rpc in the generated RuntimeService (a misspelled name does not compile).
 */
export function sandboxHandlers(sandboxes: SandboxManager, containerStatuses: SandboxContainerStatuses = () => []) {
  return {
    RunPodSandbox: async (req: RunPodSandboxRequest__Output, ctx: CallContext): Promise<RunPodSandboxResponse> => ({
      pod_sandbox_id: await sandboxes.run(req, ctx),
    }),
    StopPodSandbox: async (req: StopPodSandboxRequest__Output, ctx: CallContext) => {
      await sandboxes.stop(req.pod_sandbox_id, ctx);
      return {};
    },
    RemovePodSandbox: async (req: RemovePodSandboxRequest__Output, ctx: CallContext) => {
      await sandboxes.remove(req.pod_sandbox_id, ctx);
      return {};
    },
    PodSandboxStatus: async (req: PodSandboxStatusRequest__Output, ctx: CallContext): Promise<PodSandboxStatusResponse> => {
      const live = sandboxes.resolve(req.pod_sandbox_id);
      ctx.annotate({ sandboxId: live.record.id });
      return {
        status: podSandboxStatusView(live.record),
        info: req.verbose ? await sandboxVerboseInfo(live, sandboxes.cgroups) : {},
        containers_statuses: containerStatuses(live),
        timestamp: nowNs(),
      };
    },
    ListPodSandbox: async (req: ListPodSandboxRequest__Output): Promise<ListPodSandboxResponse> => ({
      items: sandboxes.list(req.filter).map(podSandboxView),
    }),
  } satisfies Partial<RuntimeRpcHandlers>;
}
