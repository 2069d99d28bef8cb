import { invalid } from '../common/errors.js';
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
import { firstSymlinkIn } from '../runtime/logs/open-nofollow.js';
import { sandboxVerboseInfo } from '../runtime/sandbox/info.js';
import type { SandboxManager } from '../runtime/sandbox/manager.js';
import { nowNs } from '../runtime/sandbox/record.js';
import type { LiveSandbox } from '../runtime/sandbox/types.js';
import { decodeRunPodSandbox, decodeSandboxFilter, decodeSandboxStatsFilter } from './decode/sandbox.js';
import type { RuntimeRpcHandlers } from './rpcs.js';
import type { CallContext } from './server.js';
import { podSandboxStatusView, podSandboxView } from './views/sandbox.js';
import { criPodSandboxStats } from './views/stats.js';

/**
 * RunPodSandbox's look at the host (reads only): no existing component of log_directory may be a
 * symbolic link, or the log files the daemon later writes as root would land wherever the link
 * points (a link planted in /tmp by any local user, say). A node whose /var/log is a link points
 * the kubelet's podLogsDir at the real directory instead. The files themselves are opened without
 * following any link (src/runtime/logs/open-nofollow.ts), so a link made after this check fails
 * the container's start, never writes elsewhere.
 */
async function checkLogDirectoryOnHost(dir: string, field: string): Promise<void> {
  if (dir === '') return;
  const link = await firstSymlinkIn(dir);
  if (link !== undefined)
    throw invalid(
      'SANDBOX_LOG_DIRECTORY_INVALID',
      `${field} passes through the symbolic link ${JSON.stringify(link)}; it must be a real path`,
    );
}

/** Container statuses for PodSandboxStatus (evented PLEG); supplied by the container layer. */
export type SandboxContainerStatuses = (live: LiveSandbox) => ContainerStatus[];

/**
 * Thin CRI handlers over the SandboxManager: decode the request (decode/), decide nothing, shape the answer (views/). Each is
 * checked against its rpc in the generated RuntimeService (a misspelled name does not compile).
 */
export function sandboxHandlers(sandboxes: SandboxManager, containerStatuses: SandboxContainerStatuses, stats: StatsCollector) {
  return {
    PodSandboxStats: async (req: PodSandboxStatsRequest__Output): Promise<PodSandboxStatsResponse> => ({
      stats: criPodSandboxStats(await stats.forSandbox(sandboxes.resolve(req.pod_sandbox_id))),
    }),
    ListPodSandboxStats: async (req: ListPodSandboxStatsRequest__Output): Promise<ListPodSandboxStatsResponse> => {
      const out = [];
      for (const r of sandboxes.list(decodeSandboxStatsFilter(req))) {
        const l = sandboxes.find(r.id);
        if (l !== undefined) out.push(criPodSandboxStats(await stats.forSandbox(l)));
      }
      return { stats: out };
    },
    RunPodSandbox: async (req: RunPodSandboxRequest__Output, ctx: CallContext): Promise<RunPodSandboxResponse> => {
      const { spec, runtimeHandler } = decodeRunPodSandbox(req);
      // This face writes the pod's log files (a shim's caller writes its own): their directory is checked on the host too.
      await checkLogDirectoryOnHost(spec.log_directory, 'config.log_directory');
      return { pod_sandbox_id: await sandboxes.run(spec, runtimeHandler, ctx) };
    },
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
      items: sandboxes.list(decodeSandboxFilter(req)).map(podSandboxView),
    }),
  } satisfies Partial<RuntimeRpcHandlers>;
}
