/**
 * containerd's task API (v2, and v3 under the same table) over the pod's tasks: each handler
 * decodes its request once into the values ShimTasks takes and shapes the answer; the work and
 * the state are in tasks.ts. A KataError thrown below answers the ttrpc status of its kind.
 */

import { unimplemented } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { StatsCollector } from '../runtime/container/stats-service.js';
import type { SandboxAccess } from '../runtime/sandbox/types.js';
import type { TtrpcCall } from '../ttrpc/index.js';
import { decodeLinuxResources } from './decode/index.js';
import { type MetricsVersion, metricsAny } from './metrics.js';
import { shimRequestContext } from './pod.js';
import './task-reasons.js';
import { decodeJsonAny, OCI_TYPE_URLS, type TaskHandlers, timestampOfNs } from './proto.js';
import type { ShimTasks, TaskExit, TaskState } from './tasks.js';

export interface TaskServiceDeps {
  tasks: ShimTasks;
  stats: StatsCollector;
  sandboxes: Pick<SandboxAccess, 'find'>;
  logger: Logger;
  /** The host's cgroup version decides the metrics' shape. */
  metricsVersion: MetricsVersion;
  /** Shutdown with no task left: the shim ends once this call is answered. */
  shutdown(): void;
  version: string;
}

function exitFields(exit: TaskExit | undefined): { exit_status: number; exited_at: ReturnType<typeof timestampOfNs> | null } {
  return exit === undefined ? { exit_status: 0, exited_at: null } : { exit_status: exit.status, exited_at: timestampOfNs(exit.atNs) };
}

function stateResponse(s: TaskState) {
  return {
    id: s.id,
    exec_id: s.execId,
    bundle: s.bundle,
    pid: s.pid,
    status: s.status,
    stdin: s.stdin,
    stdout: s.stdout,
    stderr: s.stderr,
    terminal: s.terminal,
    ...exitFields(s.exit),
  };
}

export function taskHandlers(deps: TaskServiceDeps): TaskHandlers {
  const { tasks } = deps;
  // Every line logged for a call names its task (the pause task's id is the sandbox's) and exec.
  const ctx = (call: TtrpcCall, req: { id: string; exec_id?: string }) =>
    shimRequestContext(
      deps.logger.child(req.exec_id ? { containerId: req.id, execId: req.exec_id } : { containerId: req.id }),
      call.method,
      {
        signal: call.signal,
        ...(call.timeoutMs === undefined ? {} : { deadlineMs: Date.now() + call.timeoutMs }),
      },
    );
  const refused = (what: string) => async () => {
    throw unimplemented('SHIM_UNSUPPORTED', `${what} is not supported: a pod VM's tasks cannot be checkpointed by kata-ts`);
  };
  return {
    State: async (req) => stateResponse(tasks.state(req.id, req.exec_id)),
    Create: async (req, call) => ({
      pid: await tasks.create(
        {
          id: req.id,
          bundle: req.bundle,
          rootfs: req.rootfs.map((m) => ({ type: m.type, source: m.source, target: m.target, options: m.options })),
          terminal: req.terminal,
          stdin: req.stdin,
          stdout: req.stdout,
          stderr: req.stderr,
        },
        ctx(call, req),
      ),
    }),
    Start: async (req, call) => ({ pid: await tasks.start(req.id, req.exec_id, ctx(call, req)) }),
    Delete: async (req, call) => {
      const { pid, exit } = await tasks.delete(req.id, req.exec_id, ctx(call, req));
      return { pid, ...exitFields(exit) };
    },
    Pids: async (req) => ({ processes: tasks.pids(req.id).map((p) => ({ pid: p.pid })) }),
    Pause: async (req, call) => {
      await tasks.freeze(req.id, true, ctx(call, req));
      return {};
    },
    Resume: async (req, call) => {
      await tasks.freeze(req.id, false, ctx(call, req));
      return {};
    },
    Checkpoint: refused('Checkpoint'),
    Kill: async (req, call) => {
      await tasks.kill(req.id, req.exec_id, req.signal, req.all, ctx(call, req));
      return {};
    },
    Exec: async (req) => {
      const spec = req.spec === null ? null : decodeJsonAny(req.spec, OCI_TYPE_URLS.process);
      await tasks.addExec(req.id, req.exec_id, { stdin: req.stdin, stdout: req.stdout, stderr: req.stderr, terminal: req.terminal }, spec);
      return {};
    },
    ResizePty: async (req) => {
      await tasks.resizePty(req.id, req.exec_id, req.width, req.height);
      return {};
    },
    CloseIO: async (req) => {
      if (req.stdin) await tasks.closeIo(req.id, req.exec_id);
      return {};
    },
    Update: async (req, call) => {
      const resources = req.resources === null ? null : decodeLinuxResources(decodeJsonAny(req.resources, OCI_TYPE_URLS.linuxResources));
      await tasks.update(req.id, { linux: resources, kubernetes_resources: null }, ctx(call, req));
      return {};
    },
    Wait: async (req, call) => {
      const exit = await tasks.wait(req.id, req.exec_id, call.signal);
      return exitFields(exit);
    },
    Stats: async (req) => {
      const record = tasks.containerRecord(req.id);
      if (record !== undefined) {
        const [usage] = await deps.stats.forContainers([record]);
        return { stats: metricsAny({ cpu: usage?.cpu ?? null, memory: usage?.memory ?? null, processCount: null }, deps.metricsVersion) };
      }
      const live = deps.sandboxes.find(req.id);
      if (live === undefined) return { stats: null };
      const usage = await deps.stats.forSandbox(live);
      return { stats: metricsAny(usage, deps.metricsVersion) };
    },
    Connect: async (req) => ({ shim_pid: process.pid, task_pid: tasks.connect(req.id).taskPid, version: deps.version }),
    Shutdown: async (req) => {
      if (tasks.empty || req.now) deps.shutdown();
      return {};
    },
  };
}
