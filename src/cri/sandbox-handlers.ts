import type { ContainerStatus } from '../generated/runtime/v1/ContainerStatus.js';
import type { ListPodSandboxRequest__Output } from '../generated/runtime/v1/ListPodSandboxRequest.js';
import type { ListPodSandboxResponse } from '../generated/runtime/v1/ListPodSandboxResponse.js';
import type { ListPodSandboxStatsRequest__Output } from '../generated/runtime/v1/ListPodSandboxStatsRequest.js';
import type { ListPodSandboxStatsResponse } from '../generated/runtime/v1/ListPodSandboxStatsResponse.js';
import type { PodSandboxStatsRequest__Output } from '../generated/runtime/v1/PodSandboxStatsRequest.js';
import type { PodSandboxStatsResponse } from '../generated/runtime/v1/PodSandboxStatsResponse.js';
import type { PodSandboxStatusRequest__Output } from '../generated/runtime/v1/PodSandboxStatusRequest.js';
import type { PodSandboxStatusResponse } from '../generated/runtime/v1/PodSandboxStatusResponse.js';
import type { RemovePodSandboxRequest__Output } from '../generated/runtime/v1/RemovePodSandboxRequest.js';
import type { RunPodSandboxRequest__Output } from '../generated/runtime/v1/RunPodSandboxRequest.js';
import type { RunPodSandboxResponse } from '../generated/runtime/v1/RunPodSandboxResponse.js';
import type { StopPodSandboxRequest__Output } from '../generated/runtime/v1/StopPodSandboxRequest.js';
import type { StatsCollector } from '../runtime/container/stats-service.js';
import { sandboxVerboseInfo } from '../runtime/sandbox/info.js';
import type { LiveSandbox, SandboxManager } from '../runtime/sandbox/manager.js';
import { nowNs } from '../runtime/sandbox/record.js';
import type { RuntimeRpcHandlers } from './rpcs.js';
import type { CallContext } from './server.js';
import { matchesLabels, podSandboxStatusView, podSandboxView } from './views/sandbox.js';

/** Container statuses for PodSandboxStatus (evented PLEG); supplied by the container layer. */
export type SandboxContainerStatuses = (live: LiveSandbox) => ContainerStatus[];

/**
 * Thin CRI handlers over the SandboxManager: decode nothing, decide nothing, map shapes. Each is
 * checked against its rpc in the generated RuntimeService (a misspelled name does not compile).
 */
export function sandboxHandlers(sandboxes: SandboxManager, containerStatuses: SandboxContainerStatuses, stats: StatsCollector) {
  return {
    PodSandboxStats: async (req: PodSandboxStatsRequest__Output): Promise<PodSandboxStatsResponse> => ({
      stats: await stats.forSandbox(sandboxes.resolve(req.pod_sandbox_id)),
    }),
    ListPodSandboxStats: async (req: ListPodSandboxStatsRequest__Output): Promise<ListPodSandboxStatsResponse> => {
      const f = req.filter;
      const live = sandboxes
        .list(null)
        .filter((r) => (f === null || f.id === '' || r.id.startsWith(f.id)) && matchesLabels(r.spec.labels, f?.label_selector ?? {}));
      const out = [];
      for (const r of live) {
        const l = sandboxes.find(r.id);
        if (l !== undefined) out.push(await stats.forSandbox(l));
      }
      return { stats: out };
    },
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
