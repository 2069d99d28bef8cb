/** A pod with a first container through a CRI, timed to the container's first output line. */
import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import type { CriClient } from '../../test/helpers/cri-client.js';
import { sleep } from './proc.js';

/** Where and how one pod is started. */
export interface TimedPodRequest {
  cri: CriClient;
  /** The RuntimeClass handler ('' for the CRI's default). */
  handler: string;
  /** The pods' log root: the pod's log directory is `<logRoot>/<namespace>_<name>_<uid>`. */
  logRoot: string;
  namespace: string;
  name: string;
  cgroupParent(uid: string): string;
  image: string;
  /** The line the container prints first; the timing ends when the CRI log holds it. */
  marker: string;
  /** Each rpc's deadline. */
  rpcDeadlineMs: number;
  /** How long the marker may take to reach the log once the container started. */
  markerTimeoutMs: number;
  /** The origin of the times (a burst's start); this call's own start when absent. */
  t0Ms?: number;
  /** Called as soon as the pod exists (to remove it later whatever happens next). */
  onPod?: (sandboxId: string) => void;
  /** Run between the pod and its container (not excluded from the times). */
  afterPod?: (sandboxId: string) => Promise<void>;
}

/** The pod and the times from t0: the pod ready, the container started, its marker logged. */
export interface TimedPod {
  sandboxId: string;
  uid: string;
  logDir: string;
  podMs: number;
  startedMs: number;
  totalMs: number;
}

/** RunPodSandbox, CreateContainer (`echo <marker>; exec sleep`), StartContainer, then the marker. */
export async function timedPodWithContainer(req: TimedPodRequest): Promise<TimedPod> {
  const t0 = req.t0Ms ?? performance.now();
  const uid = randomUUID();
  const logDir = path.join(req.logRoot, `${req.namespace}_${req.name}_${uid}`);
  await fsp.mkdir(logDir, { recursive: true });
  const config = {
    metadata: { name: req.name, uid, namespace: req.namespace, attempt: 0 },
    log_directory: logDir,
    linux: { cgroup_parent: req.cgroupParent(uid) },
  };
  const deadline = () => ({ deadline: Date.now() + req.rpcDeadlineMs });
  const { pod_sandbox_id: sandboxId } = await req.cri.runtime.RunPodSandbox({ config, runtime_handler: req.handler }, deadline());
  req.onPod?.(sandboxId);
  const podMs = performance.now() - t0;
  if (req.afterPod !== undefined) await req.afterPod(sandboxId);
  const { container_id: containerId } = await req.cri.runtime.CreateContainer(
    {
      pod_sandbox_id: sandboxId,
      config: {
        metadata: { name: 'c', attempt: 0 },
        image: { image: req.image },
        command: ['sh', '-c', `echo ${req.marker}; exec sleep 100000`],
        log_path: 'c.log',
      },
      sandbox_config: config,
    },
    deadline(),
  );
  await req.cri.runtime.StartContainer({ container_id: containerId }, deadline());
  const startedMs = performance.now() - t0;
  await untilLogLine(path.join(logDir, 'c.log'), req.marker, req.markerTimeoutMs);
  return { sandboxId, uid, logDir, podMs, startedMs, totalMs: performance.now() - t0 };
}

/** Polls a CRI log until a line carries `marker`. */
export async function untilLogLine(file: string, marker: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await fsp.readFile(file, 'utf8').catch(() => '');
    if (text.includes(marker)) return;
    if (Date.now() > deadline)
      throw new Error(`no "${marker}" line in ${file} within ${timeoutMs} ms; it holds ${JSON.stringify(text.slice(-300))}`);
    await sleep(10);
  }
}
