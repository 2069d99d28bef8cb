/**
 * containerd 2.x's Sandbox API (`containerd.runtime.sandbox.v1.Sandbox`), served when a runtime
 * says `sandboxer = "shim"`: containerd runs no pause container and hands the shim the whole pod
 * instead. CreateSandbox carries the CRI's PodSandboxConfig (its `linux.resources` and `overhead`
 * size the VM, as the standalone door's RunPodSandbox does) and the network namespace containerd
 * made; StartSandbox boots the VM; the pod's app containers then arrive through the task API on
 * the same socket, as containers of this sandbox. Stop, Wait, Status, Ping, Metrics and Shutdown
 * map onto the same core the task API's sandbox task uses.
 */

import { criReflectionRoot, PROTO_LOADER_OPTIONS } from '../common/cri-schema.js';
import { invalid, notFound, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { PodSandboxConfig__Output } from '../generated/runtime/v1/PodSandboxConfig.js';
import type { StatsCollector } from '../runtime/container/stats-service.js';
import { decodeSandboxSpec, type SandboxSpec } from '../runtime/spec/sandbox.js';
import type { TtrpcCall } from '../ttrpc/index.js';
import { type MetricsVersion, metricsAny } from './metrics.js';
import { type ShimPod, shimRequestContext } from './pod.js';
import type { ServiceHandlers } from './proto.js';
import { timestampOfNs } from './proto.js';
import './sandbox-reasons.js';
import type { ShimTasks } from './tasks.js';

/** The service's name on the wire. */
export const SANDBOX_SERVICE = 'containerd.runtime.sandbox.v1.Sandbox';
/** The type url containerd's CRI gives the pod config in CreateSandbox's `options` (typeurl: the bare full name). */
export const POD_SANDBOX_CONFIG_TYPE_URL = 'runtime.v1.PodSandboxConfig';

export interface SandboxServiceDeps {
  tasks: ShimTasks;
  pod: Pick<ShimPod, 'sandboxes' | 'sandboxExited'>;
  stats: StatsCollector;
  logger: Logger;
  metricsVersion: MetricsVersion;
  /** The sandbox id this shim was started for (`-id`). */
  sandboxId: string;
  /** End the shim once the answer is sent. */
  shutdown(): void;
}

/** GOARCH's spelling of this process's architecture (what containerd's Platform expects). */
export function goArch(nodeArch: string = process.arch): string {
  const map: Record<string, string> = { x64: 'amd64', arm64: 'arm64', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64' };
  return map[nodeArch] ?? nodeArch;
}

/** The PodSandboxConfig in CreateSandbox's `options`, decoded as the CRI face decodes it (pure). */
export function decodePodSandboxOptions(options: { type_url: string; value: Uint8Array } | null): PodSandboxConfig__Output {
  if (options === null) {
    throw invalid(
      'SHIM_SANDBOX_OPTIONS_INVALID',
      'CreateSandboxRequest.options is empty: the pod config (runtime.v1.PodSandboxConfig) is missing.',
    );
  }
  const url = options.type_url.replace(/^.*\//, '');
  if (url !== POD_SANDBOX_CONFIG_TYPE_URL) {
    throw invalid(
      'SHIM_SANDBOX_OPTIONS_INVALID',
      `CreateSandboxRequest.options is a ${options.type_url}, not a ${POD_SANDBOX_CONFIG_TYPE_URL}.`,
      { details: { typeUrl: options.type_url } },
    );
  }
  const type = criReflectionRoot().lookupType('runtime.v1.PodSandboxConfig');
  let message: ReturnType<typeof type.decode>;
  try {
    message = type.decode(options.value);
  } catch (err) {
    throw invalid('SHIM_SANDBOX_OPTIONS_INVALID', `CreateSandboxRequest.options does not decode as ${POD_SANDBOX_CONFIG_TYPE_URL}.`, {
      cause: err,
    });
  }
  return type.toObject(message, PROTO_LOADER_OPTIONS) as PodSandboxConfig__Output;
}

interface Prepared {
  spec: SandboxSpec;
  netnsPath: string;
  createdAtNs: bigint | undefined;
}

/** The Sandbox API's handlers for one pod's shim. */
export function sandboxHandlers(deps: SandboxServiceDeps): ServiceHandlers<typeof SANDBOX_SERVICE> {
  let prepared: Prepared | undefined;
  let exit: { status: number; atNs: bigint } | undefined;
  const watch = new AbortController();
  const ctx = (call: TtrpcCall) =>
    shimRequestContext(deps.logger.child({ sandboxId: deps.sandboxId }), call.method, {
      signal: call.signal,
      ...(call.timeoutMs === undefined ? {} : { deadlineMs: Date.now() + call.timeoutMs }),
    });
  const ours = (id: string, field = 'sandbox_id'): void => {
    if (id !== deps.sandboxId) {
      throw notFound('SHIM_SANDBOX_UNKNOWN', `${field} ${id} is not this shim's sandbox (${deps.sandboxId}).`, {
        details: { sandboxId: id },
      });
    }
  };
  const running = () => {
    const live = deps.pod.sandboxes.find(deps.sandboxId);
    return live?.vm !== undefined && live.record.state === 'SANDBOX_READY' ? live : undefined;
  };
  let exited: Promise<{ status: number; atNs: bigint }> | undefined;
  const exitOnce = () => {
    exited ??= deps.pod.sandboxExited(deps.sandboxId, watch.signal).then((e) => {
      exit = e;
      return e;
    });
    return exited;
  };

  return {
    CreateSandbox: async (req) => {
      ours(req.sandbox_id);
      if (prepared !== undefined) throw precondition('SHIM_SANDBOX_EXISTS', `sandbox ${req.sandbox_id} was created already.`);
      if (req.rootfs.length > 0) {
        throw invalid('SHIM_SANDBOX_OPTIONS_INVALID', 'CreateSandboxRequest.rootfs: a VM sandbox takes no root filesystem of its own.');
      }
      // Judged as the standalone door judges RunPodSandbox's config: names, log dir, DNS, sysctls, host namespaces.
      prepared = { spec: decodeSandboxSpec(decodePodSandboxOptions(req.options)), netnsPath: req.netns_path, createdAtNs: undefined };
      return {};
    },
    StartSandbox: async (req, call) => {
      ours(req.sandbox_id);
      if (prepared === undefined)
        throw precondition('SHIM_SANDBOX_NOT_CREATED', `sandbox ${req.sandbox_id}: StartSandbox before CreateSandbox.`);
      const pid = await deps.tasks.runSandbox(req.sandbox_id, prepared.spec, prepared.netnsPath, ctx(call));
      prepared.createdAtNs = BigInt(Date.now()) * 1_000_000n;
      void exitOnce().catch(() => undefined);
      return { pid, created_at: timestampOfNs(prepared.createdAtNs) };
    },
    Platform: async (req) => {
      ours(req.sandbox_id);
      return { platform: { os: 'linux', architecture: goArch() } };
    },
    StopSandbox: async (req, call) => {
      ours(req.sandbox_id);
      // containerd's port-forward door goes before the VM (and before containerd removes the namespace).
      await deps.tasks.closePortDoor();
      if (deps.pod.sandboxes.find(req.sandbox_id) !== undefined) await deps.pod.sandboxes.stop(req.sandbox_id, ctx(call));
      return {};
    },
    WaitSandbox: async (req) => {
      ours(req.sandbox_id);
      if (deps.pod.sandboxes.find(req.sandbox_id) === undefined && exit === undefined) {
        return { exit_status: 0, exited_at: timestampOfNs(BigInt(Date.now()) * 1_000_000n) };
      }
      const e = await exitOnce();
      return { exit_status: e.status, exited_at: timestampOfNs(e.atNs) };
    },
    SandboxStatus: async (req) => {
      ours(req.sandbox_id);
      const live = running();
      return {
        sandbox_id: req.sandbox_id,
        pid: live?.vm?.pid ?? 0,
        state: live === undefined ? 'SANDBOX_NOTREADY' : 'SANDBOX_READY',
        info: (req.verbose && live !== undefined ? { vmmPid: String(live.vm?.pid ?? 0) } : {}) as Record<string, string>,
        created_at: prepared?.createdAtNs === undefined ? null : timestampOfNs(prepared.createdAtNs),
        exited_at: exit === undefined ? null : timestampOfNs(exit.atNs),
        extra: null,
      };
    },
    PingSandbox: async (req) => {
      ours(req.sandbox_id);
      if (running() === undefined) throw notFound('SHIM_SANDBOX_UNKNOWN', `sandbox ${req.sandbox_id} is not running.`);
      return {};
    },
    ShutdownSandbox: async (req, call) => {
      ours(req.sandbox_id);
      if (deps.pod.sandboxes.find(req.sandbox_id) !== undefined) await deps.pod.sandboxes.remove(req.sandbox_id, ctx(call));
      watch.abort();
      deps.shutdown();
      return {};
    },
    SandboxMetrics: async (req) => {
      ours(req.sandbox_id);
      const live = running();
      if (live === undefined) throw notFound('SHIM_SANDBOX_UNKNOWN', `sandbox ${req.sandbox_id} is not running.`);
      const usage = await deps.stats.forSandbox(live);
      return {
        metrics: {
          timestamp: timestampOfNs(BigInt(Date.now()) * 1_000_000n),
          id: req.sandbox_id,
          data: metricsAny(usage, deps.metricsVersion),
        },
      };
    },
  };
}
