/**
 * A pre-booted VM's warm-up (pool fill, template build): before the VM waits for a pod, one
 * throwaway pod with one container runs through the guest's whole container path, the way a
 * kubelet's first pod will: CreatePod, CreateContainer, StartContainer, its output read to the
 * end, an exec, WaitContainer, DeleteContainer, DestroyPod.
 *
 * Why: measured on a clone (TCG), the first container of a pod took 2.3 s from create to its
 * first output line and the second 1.0 s. The difference is work done once per guest: the agent
 * compiling its container code (V8 compiles lazily, on first call), the page cache filling with
 * crun and its libraries, and, in a pooled VM, QEMU translating that guest code. A template saved
 * after the warm-up hands the first two to every clone (the compiled code and the page cache are
 * in its RAM, shared until written); a pooled VM keeps all three.
 *
 * The container's root is the guest image's own `/usr/lib/kata-ts/warm-rootfs` (a static busybox,
 * scripts/build-guest.sh): a pre-booted VM has no shared directory to take an image from. Its spec
 * is made by `buildOciSpec` like any container's, minus the pod's etc files (they come over the
 * shared directory). No pod, container or process of it is left; only the empty cgroup
 * directory crun made for the pod (`/kata-ts/kata-ts-warm-up` in the guest's cgroup2), as every
 * pod leaves one (the agent removes a container's cgroup, not its pod's).
 */
import type { AgentClient } from '../../agent-client/index.js';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { buildOciSpec, guestLayout } from '../../oci/index.js';

/** The warm-up's root in the guest (read-only: the guest image). */
export const WARM_ROOTFS = '/usr/lib/kata-ts/warm-rootfs';
/** Pod and container id of the warm-up: no CRI id has this form (those are 64 hex digits). */
export const WARM_ID = 'kata-ts-warm-up';
/** What the warm container prints (and the host reads back, as a pod's log would). */
export const WARM_LINE = 'kata-ts warm-up';

/** The warm container's OCI spec: a read-only root, the pod's namespaces, no etc files. */
export function warmSpec(pod: { pausePid: number; shmPath: string }): Record<string, unknown> {
  const guest = guestLayout({
    sandboxId: WARM_ID,
    containerId: WARM_ID,
    rootfsGuestPath: WARM_ROOTFS,
    guestDir: `/run/${WARM_ID}`,
    mountSources: {},
    pod,
  });
  const { spec } = buildOciSpec({
    container: {
      command: ['/bin/sh', '-c', `echo ${WARM_LINE}; exec sleep 600`],
      linux: { security_context: { readonly_rootfs: true } },
    },
    sandbox: { hostname: WARM_ID },
    image: null,
    guest,
  });
  // The etc files (hosts, hostname, resolv.conf) are written over the shared directory, which a
  // pre-booted VM does not have yet.
  const mounts = (spec.mounts ?? []).filter((m) => !m.source?.startsWith(`${guest.etcDir}/`));
  return { ...spec, mounts };
}

/** The warm-up's steps, in the order they run. */
export const WARM_UP_STEPS = [
  'createPod',
  'createContainer',
  'startContainer',
  'output',
  'exec',
  'stop',
  'deleteContainer',
  'destroyPod',
] as const;
export type WarmUpStep = (typeof WARM_UP_STEPS)[number];

export interface WarmUpResult {
  /** The whole warm-up, in the host's time. */
  ms: number;
  /** Each step's time, in order (up to the one that failed). */
  steps: Partial<Record<WarmUpStep, number>>;
  /** Why a step failed (a guest image without the warm root, say); the guest is clean again. */
  failed?: string;
}

/**
 * Run the warm-up through `agent`, each call bounded by `callTimeoutMs`. A failed step is
 * reported in the result once what the warm-up made is gone again: the VM is as it was, only
 * not warm. Throws only when that cleanup fails too (the caller discards the VM).
 */
export async function warmUpGuest(agent: AgentClient, callTimeoutMs: number, logger: Logger): Promise<WarmUpResult> {
  const opts = { timeoutMs: callTimeoutMs };
  const steps: Partial<Record<WarmUpStep, number>> = {};
  const started = Date.now();
  let at = started;
  const step = async <T>(name: WarmUpStep, work: () => Promise<T>): Promise<T> => {
    const value = await work();
    const now = Date.now();
    steps[name] = now - at;
    at = now;
    return value;
  };
  let podMade = false;
  let containerMade = false;
  try {
    const pod = await step('createPod', () =>
      agent.createPod({ podId: WARM_ID, hostname: WARM_ID, shmSizeBytes: 0, withoutSharedDir: true }, opts),
    );
    podMade = true;
    await step('createContainer', () =>
      agent.createContainer(
        {
          containerId: WARM_ID,
          ociConfigJson: JSON.stringify(warmSpec({ pausePid: pod.pausePid, shmPath: pod.shmPath })),
          rootfsPath: WARM_ROOTFS,
          stdio: 'STDIO_MODE_PIPES',
          stdin: false,
          stdinOnce: false,
          devices: [],
          secrets: [],
        },
        opts,
      ),
    );
    containerMade = true;
    await step('startContainer', () => agent.startContainer(WARM_ID, opts));
    await step('output', () => readLine(agent, opts.timeoutMs));
    await step('exec', async () => {
      await agent.execProcess(
        {
          containerId: WARM_ID,
          execId: 'warm-exec',
          ociProcessJson: JSON.stringify({ args: ['/bin/sh', '-c', 'true'], cwd: '/', env: ['PATH=/bin'], user: { uid: 0, gid: 0 } }),
          tty: false,
          stdin: false,
        },
        opts,
      );
      const exit = await agent.waitProcess(WARM_ID, 'warm-exec', opts);
      if (exit.exitCode !== 0) throw new Error(`the warm-up exec exited ${exit.exitCode}`);
      await agent.deleteProcess(WARM_ID, 'warm-exec', opts);
    });
    await step('stop', async () => {
      await agent.signalContainer(WARM_ID, 9, false, opts);
      await agent.waitContainer(WARM_ID, opts);
    });
    await step('deleteContainer', () => agent.deleteContainer(WARM_ID, false, opts));
    containerMade = false;
    await step('destroyPod', () => agent.destroyPod(WARM_ID, opts));
    podMade = false;
    return { ms: Date.now() - started, steps };
  } catch (err) {
    const failed = errorMessage(err);
    logger.warn({ err: failed, steps }, 'guest warm-up failed; the VM waits unwarmed');
    try {
      if (containerMade) await agent.deleteContainer(WARM_ID, true, opts);
      if (podMade) await agent.destroyPod(WARM_ID, opts);
    } catch (cleanup) {
      throw new Error(`the guest warm-up failed (${failed}) and its pod could not be removed: ${errorMessage(cleanup)}`, {
        cause: cleanup,
      });
    }
    return { ms: Date.now() - started, steps, failed };
  }
}

/** Reads the warm container's output until its line is there (and acknowledges it). */
async function readLine(agent: AgentClient, timeoutMs: number): Promise<void> {
  let text = '';
  for await (const chunk of agent.streamOutput(WARM_ID, 0, { timeoutMs })) {
    text += Buffer.from(chunk.data).toString('utf8');
    if (text.includes(WARM_LINE)) {
      await agent.ackOutput(WARM_ID, chunk.offset + chunk.data.length, { timeoutMs });
      return;
    }
    if (chunk.eof) break;
  }
  throw new Error(`the warm-up container ended without printing its line (it printed ${JSON.stringify(text.slice(0, 200))})`);
}
