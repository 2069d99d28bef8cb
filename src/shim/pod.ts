/**
 * One pod's core, composed in its shim process: what src/daemon/daemon.ts composes for a whole
 * node, narrowed to one pod on the pod's own state dir, and without what containerd keeps for
 * itself behind a shim: the CRI, images, CNI (containerd runs it in the namespace it hands us),
 * streaming, logs and the metrics endpoint.
 */
import os from 'node:os';
import { createCgroupDriver, detectCgroupMode } from '../cgroups/index.js';
import { errorMessage, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { epochNs } from '../common/time.js';
import type { CgroupDriverName, CgroupDriverSetting, KataConfig, LoadedConfig } from '../config/types.js';
import { GUEST_SHARED_DIR } from '../hypervisor/argv.js';
import { readPcieHostFacts } from '../pcie/index.js';
import { ContainerManager } from '../runtime/container/manager.js';
import { CONTAINER_RECORD_KIND, type ContainerRecord } from '../runtime/container/record.js';
import { StatsCollector } from '../runtime/container/stats-service.js';
import type { ImageLookup, SandboxGuestAccess } from '../runtime/container/types.js';
import { ResourceUpdates } from '../runtime/container/updates.js';
import type { RequestContext } from '../runtime/context.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import { gatherFacts } from '../runtime/gather-facts.js';
import { RuntimeMetrics } from '../runtime/metrics.js';
import { SandboxManager } from '../runtime/sandbox/manager.js';
import { sandboxSharedDir, sandboxVmRoot } from '../runtime/sandbox/paths.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../runtime/sandbox/record.js';
import { RecordStore } from '../runtime/store.js';
import './reasons.js';

/**
 * The cgroup driver a pod's VMM is placed with, from the sandbox spec's `linux.cgroupsPath` as
 * containerd and CRI-O write it: `slice:prefix:name` (runc's systemd form, e.g.
 * `kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`) means systemd; a path
 * (`/kubepods/besteffort/pod<uid>/<id>`) means cgroupfs. Null when the spec names none: the
 * config's `cgroupDriver` (or detection) decides.
 */
export function cgroupDriverForPath(cgroupsPath: string | null | undefined): CgroupDriverName | null {
  if (cgroupsPath === null || cgroupsPath === undefined || cgroupsPath === '') return null;
  return cgroupsPath.split(':').length === 3 ? 'systemd' : 'cgroupfs';
}

/**
 * The cgroup driver a pod's VMM is placed with: the config's `cgroupDriver` when it names one (as
 * runc's own SystemdCgroup option, not the path's form, decides for runc). Under `auto`, what the
 * host runs decides (`hostDriver`: detectCgroupDriver's answer, systemd only where systemd runs),
 * and the sandbox spec's `linux.cgroupsPath` form (cgroupDriverForPath) only picks among what runs:
 * a `slice:prefix:name` path on a host without systemd is placed with cgroupfs (critest through
 * containerd 1.6 sends a `/test.slice` parent whatever the node runs, and no D-Bus answers there),
 * while a cgroupfs path on a systemd host stays cgroupfs, as runc would place it.
 */
export function podCgroupDriver(
  configured: CgroupDriverSetting,
  cgroupsPath: string | null | undefined,
  hostDriver: CgroupDriverName,
): CgroupDriverName {
  if (configured !== 'auto') return configured;
  const pathDriver = cgroupDriverForPath(cgroupsPath);
  if (pathDriver === 'systemd' && hostDriver !== 'systemd') return 'cgroupfs';
  return pathDriver ?? hostDriver;
}

/**
 * The cgroup_parent the core gets for a pod whose spec's path has `pathDriver`'s form while the
 * pod runs with `driver`. The same driver: the parent as decoded. A systemd slice under a
 * configured cgroupfs driver (critest through containerd 1.6 sends `/test.slice` whatever the node
 * runs, as 1.6 has no RuntimeConfig to ask; runc configured without SystemdCgroup likewise ignores
 * the slice): '' so the VMM goes to `<cgroupRoot>/kata-ts-<id>`. A cgroupfs path under systemd
 * stays as it is (the systemd driver refuses it with CGROUP_PARENT_STYLE_MISMATCH).
 */
export function cgroupParentForDriver(driver: CgroupDriverName, pathDriver: CgroupDriverName | null, parent: string): string {
  return driver === 'cgroupfs' && pathDriver === 'systemd' ? '' : parent;
}

/**
 * Images are containerd's: a container's root filesystem is the one its snapshotter prepared and
 * the Task API hands over (ContainerCreateOptions.rootfs), so the pod's core never looks one up.
 */
const NO_IMAGES: ImageLookup = {
  resolveImage: () => undefined,
  rootfsSourceFor: (imageId) => {
    throw precondition('SHIM_NO_IMAGE_STORE', `image ${imageId}: the shim has no image store; containerd passes each container's rootfs.`);
  },
  imageConfig: async () => null,
};

export interface ShimPodOptions {
  loaded: LoadedConfig;
  /** The pod's state dir (src/shim/paths.ts podStateDir): the core's stateDir for this pod. */
  stateDir: string;
  /** podCgroupDriver's choice; null: the config's setting or detection. */
  cgroupDriver: CgroupDriverName | null;
  logger: Logger;
  /** Facts decided by the caller (tests); gathered from the host when absent. */
  facts?: RuntimeFacts;
}

/** One pod's core: the managers on the pod's state dir, and what they share. */
export interface ShimPod {
  /** The loaded config with `stateDir` set to the pod's state dir and the chosen cgroup driver. */
  config: KataConfig;
  facts: RuntimeFacts;
  stateDir: string;
  logger: Logger;
  sandboxes: SandboxManager;
  containers: ContainerManager;
  resize: ResourceUpdates;
  stats: StatsCollector;
  guests: SandboxGuestAccess;
  /** Find the pod's sandbox and containers again from their records (reattaching a VM that still runs). */
  recover(): Promise<void>;
  /** Sandboxes and containers the pod holds (containerd's tasks); 0 when the shim may go. */
  taskCount(): number;
  /**
   * Resolves when the sandbox's VM has stopped (StopPodSandbox's stop, or the VM ended on its
   * own), with the exit status containerd hears for the sandbox task; `signal` ends the wait.
   */
  sandboxExited(id: string, signal: AbortSignal): Promise<{ status: number; atNs: bigint }>;
  /** Drop the connections to the VM, which keeps running (found again by `recover`). */
  close(): Promise<void>;
}

/** The sandbox task's exit status: the VM is ended as by SIGKILL, whoever ended it. */
const SANDBOX_EXIT_STATUS = 128 + 9;

/** Compose the pod's core on its state dir. Creates nothing on disk until `recover()`. */
export async function composePod(options: ShimPodOptions): Promise<ShimPod> {
  const { logger, stateDir } = options;
  const base = options.loaded.config;
  const config: KataConfig = {
    ...base,
    stateDir,
    ...(options.cgroupDriver === null ? {} : { cgroupDriver: options.cgroupDriver }),
  };
  const facts = options.facts ?? (await gatherFacts({ config, path: options.loaded.path }));
  logger.info({ stateDir, accel: facts.acceleration, cgroupDriver: facts.cgroupDriver, qemu: facts.qemu }, 'pod core composed');
  await detectCgroupMode(config.cgroupRoot).catch((err: unknown) =>
    logger.error({ cgroupRoot: config.cgroupRoot, err: errorMessage(err) }, 'no cgroups found: the pod VM cannot be placed'),
  );
  // Sandboxes whose VM stopped, and the waits for that (sandboxExited).
  const stopped = new Set<string>();
  const waiting = new Set<(id: string) => void>();
  const driverOptions = { cgroupRoot: config.cgroupRoot, dbusAddress: config.dbusAddress, logger };
  const host = { cpus: Math.max(1, os.cpus().length), memoryMiB: Math.floor(os.totalmem() / (1024 * 1024)) };
  const readPcieFacts = () => readPcieHostFacts(config.pcie);
  const sandboxes = new SandboxManager({
    config,
    facts,
    logger,
    metrics: new RuntimeMetrics(),
    cgroups: createCgroupDriver(facts.cgroupDriver.name, driverOptions),
    store: new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, logger),
    host,
    readPcieFacts,
    cgroupDriverNamed: (name) => createCgroupDriver(name, driverOptions),
    // Containers are told when their sandbox stops or goes (containers is defined just below).
    listener: {
      sandboxStopping: (id, deadlineMs) => containers.sandboxStopping(id, deadlineMs),
      sandboxStopped: async (id) => {
        await containers.sandboxStopped(id);
        stopped.add(id);
        for (const wake of [...waiting]) wake(id);
      },
      sandboxRemoving: (id) => containers.sandboxRemoving(id),
    },
  });
  const store = new RecordStore<ContainerRecord>(stateDir, CONTAINER_RECORD_KIND, logger);
  const guests: SandboxGuestAccess = {
    agentOf: (id) => {
      const live = sandboxes.find(id);
      return live?.vm !== undefined ? live.agent : undefined;
    },
    sharedDirOf: (id) => sandboxSharedDir(stateDir, id),
    sharedDirsRoot: sandboxVmRoot(stateDir),
    guestSharedDir: GUEST_SHARED_DIR,
    guestPodOf: (id) => sandboxes.find(id)?.record.guestPod ?? null,
  };
  const containers = new ContainerManager({ config, logger, store, sandboxes, images: NO_IMAGES, host, readPcieFacts, guests });
  const resize = new ResourceUpdates({ config, host, sandboxes, containers, store });
  // containerd measures a container's snapshot itself: no walk of the merged root per Stats.
  const stats = new StatsCollector(containers, guests, { layerUsage: false });
  return {
    config,
    facts,
    stateDir,
    logger,
    sandboxes,
    containers,
    resize,
    stats,
    guests,
    recover: async () => {
      await sandboxes.recover();
      await containers.recover();
    },
    taskCount: () => sandboxes.list(null).length + containers.list(null).length,
    sandboxExited: (id, signal) =>
      new Promise((resolve, reject) => {
        const done = () => ({ status: SANDBOX_EXIT_STATUS, atNs: epochNs() });
        const live = sandboxes.find(id);
        if (stopped.has(id) || (live !== undefined && live.vm === undefined)) return resolve(done());
        const wake = (which: string) => {
          if (which !== id) return;
          waiting.delete(wake);
          resolve(done());
        };
        waiting.add(wake);
        signal.addEventListener(
          'abort',
          () => {
            waiting.delete(wake);
            reject(signal.reason);
          },
          { once: true },
        );
      }),
    close: async () => {
      await containers.close();
      sandboxes.close();
    },
  };
}

/**
 * A RequestContext for the core when the shim acts on its own (delete, shutdown) or for one rpc:
 * its logger names the method, its signal and deadline are the caller's (none by default).
 */
export function shimRequestContext(
  logger: Logger,
  method: string,
  options: { signal?: AbortSignal; deadlineMs?: number } = {},
): RequestContext {
  const fields: Record<string, unknown> = {};
  return {
    method,
    logger: logger.child({ method }),
    signal: options.signal ?? new AbortController().signal,
    deadlineMs: options.deadlineMs,
    annotate: (extra) => Object.assign(fields, extra),
  };
}
