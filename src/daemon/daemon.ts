import os from 'node:os';
import { createCgroupDriver, detectCgroupMode } from '../cgroups/index.js';
import { errorMessage } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { KataConfig, LoadedConfig } from '../config/types.js';
import { containerHandlers, containerStreamHandlers } from '../cri/container-handlers.js';
import { imageServiceHandlers } from '../cri/image-handlers.js';
import { loadCriPackage } from '../cri/proto.js';
import { RUNTIME_RPCS_NOT_IMPLEMENTED, type RuntimeRpcHandlers } from '../cri/rpcs.js';
import { runtimeConfigResponse, statusResponse, updateRuntimeConfig, versionResponse } from '../cri/runtime-info.js';
import { sandboxHandlers } from '../cri/sandbox-handlers.js';
import { type CriServer, startCriServer } from '../cri/server.js';
import { StreamingServer } from '../cri/streaming/server.js';
import { streamingHandlers, streamingTargets } from '../cri/streaming-handlers.js';
import { containerStatusView } from '../cri/views/container.js';
import { podSandboxStatusView } from '../cri/views/sandbox.js';
import type { StatusRequest__Output } from '../generated/runtime/v1/StatusRequest.js';
import type { UpdateRuntimeConfigRequest__Output } from '../generated/runtime/v1/UpdateRuntimeConfigRequest.js';
import { GUEST_SHARED_DIR } from '../hypervisor/argv.js';
import { ImageService } from '../images/service.js';
import { NETNS_DIR, networkReadiness, PodNetworks } from '../network/index.js';
import { readPcieHostFacts } from '../pcie/index.js';
import { ContainerManager } from '../runtime/container/manager.js';
import { CONTAINER_RECORD_KIND, type ContainerRecord } from '../runtime/container/record.js';
import { StatsCollector } from '../runtime/container/stats-service.js';
import type { SandboxGuestAccess } from '../runtime/container/types.js';
import { ResourceUpdates } from '../runtime/container/updates.js';
import type { RequestContext } from '../runtime/context.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import { gatherFacts } from '../runtime/gather-facts.js';
import { type MetricsEndpoint, RuntimeMetrics, serveMetrics } from '../runtime/metrics.js';
import { PoolManager, registerPoolMetrics } from '../runtime/pool/manager.js';
import { SandboxManager } from '../runtime/sandbox/manager.js';
import { auditOrphans, ownersFromRecords } from '../runtime/sandbox/orphan-audit.js';
import { sandboxSharedDir, sandboxVmRoot } from '../runtime/sandbox/paths.js';
import { type PauseOutcome, pausePod, resumePod } from '../runtime/sandbox/pause.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../runtime/sandbox/record.js';
import { acquireStateLock } from '../runtime/state-lock.js';
import { RecordStore } from '../runtime/store.js';
import { TemplateManager } from '../runtime/template/manager.js';

export interface DaemonOptions {
  loaded: LoadedConfig;
  logger: Logger;
  /** Facts decided by the caller (tests); gathered from the host when absent. */
  facts?: RuntimeFacts;
}

/** A running kata-ts: the CRI server, the metrics endpoint and the state behind them. */
export interface Daemon {
  config: KataConfig;
  facts: RuntimeFacts;
  socketPath: string;
  metricsAddress: string | null;
  metrics: RuntimeMetrics;
  /** Base URL of the streaming server (Exec, Attach, PortForward). */
  streamingUrl: string;
  /** The pool of pre-booted VMs (docs/pool.md). */
  pool: PoolManager;
  /** Pause and resume of a pod (src/runtime/sandbox/pause.ts), for `kata-ts pause|resume`. */
  pods: {
    pause(id: string, ctx: RequestContext): Promise<PauseOutcome>;
    resume(id: string, ctx: RequestContext): Promise<PauseOutcome>;
  };
  /** Stop serving. Pod VMs keep running: they are found again by the next start. */
  close(): Promise<void>;
}

/** Compose and start the daemon from a loaded config. */
export async function startDaemon(options: DaemonOptions): Promise<Daemon> {
  const { config } = options.loaded;
  const logger = options.logger;
  // First of all: a state directory belongs to one daemon; a second one changes nothing.
  const lock = await acquireStateLock(config.stateDir, logger);
  try {
    return await composeDaemon(options, lock.release);
  } catch (err) {
    await lock.release();
    throw err;
  }
}

async function composeDaemon(options: DaemonOptions, releaseLock: () => Promise<void>): Promise<Daemon> {
  const { config } = options.loaded;
  const logger = options.logger;
  const facts = options.facts ?? (await gatherFacts(options.loaded));
  logger.info(
    {
      configPath: facts.configPath,
      accel: facts.acceleration,
      cgroupDriver: facts.cgroupDriver,
      qemu: facts.qemu,
      guestAssets: facts.guestAssets,
    },
    'kata-ts starting',
  );
  // Said once, loudly, at start: `ip netns exec` (a fresh sysfs) is the usual way to get here.
  await detectCgroupMode(config.cgroupRoot).catch((err: unknown) =>
    logger.error(
      { cgroupRoot: config.cgroupRoot, err: errorMessage(err) },
      'no cgroups found: every RunPodSandbox will be refused (in a network namespace, start the daemon with nsenter --net=, not ip netns exec)',
    ),
  );
  const metrics = new RuntimeMetrics();
  const cri = loadCriPackage();

  // The driver RuntimeConfig advertises is the one every VMM is placed with: never another.
  const driverOptions = { cgroupRoot: config.cgroupRoot, dbusAddress: config.dbusAddress, logger };
  const cgroups = createCgroupDriver(facts.cgroupDriver.name, driverOptions);
  const host = { cpus: Math.max(1, os.cpus().length), memoryMiB: Math.floor(os.totalmem() / (1024 * 1024)) };
  const readPcieFacts = () => readPcieHostFacts(config.pcie);
  const network = config.network.mode === 'cni' ? new PodNetworks(config.network) : undefined;
  // Pre-booted VMs (docs/pool.md): recovered (or drained) always, offered to RunPodSandbox when sized.
  const pool = new PoolManager({ config, facts, cgroups, host, readPcieFacts, logger, ...(network === undefined ? {} : { network }) });
  await pool.recover();
  registerPoolMetrics(metrics.registry, pool);
  // VM templates (docs/templates.md): built once the daemon answers, offered before the pool.
  const templates = new TemplateManager({ config, facts, host, readPcieFacts, logger });
  const sandboxes = new SandboxManager({
    config,
    facts,
    logger,
    metrics,
    cgroups,
    store: new RecordStore<SandboxRecord>(config.stateDir, SANDBOX_RECORD_KIND, logger),
    host,
    readPcieFacts,
    ...(network === undefined ? {} : { network }),
    ...(pool.sizes().length > 0 ? { pool } : {}),
    ...(templates.enabled ? { templates } : {}),
    cgroupDriverNamed: (name) => createCgroupDriver(name, driverOptions),
    // Containers are told when their sandbox stops or goes (containers is defined just below).
    listener: {
      sandboxStopping: (id, deadlineMs) => containers.sandboxStopping(id, deadlineMs),
      sandboxStopped: (id) => containers.sandboxStopped(id),
      sandboxRemoving: (id) => containers.sandboxRemoving(id),
    },
  });
  const containerStore = new RecordStore<ContainerRecord>(config.stateDir, CONTAINER_RECORD_KIND, logger);
  // What containers need of a sandbox's guest: its agent, its shared directory, its pod.
  const guests: SandboxGuestAccess = {
    agentOf: (id) => {
      const live = sandboxes.find(id);
      return live?.vm !== undefined ? live.agent : undefined;
    },
    sharedDirOf: (id) => sandboxSharedDir(config.stateDir, id),
    sharedDirsRoot: sandboxVmRoot(config.stateDir),
    guestSharedDir: GUEST_SHARED_DIR,
    guestPodOf: (id) => sandboxes.find(id)?.record.guestPod ?? null,
  };
  // Containers look images up; the image store asks containers whether an image is in use.
  const containers = new ContainerManager({
    config,
    logger,
    store: containerStore,
    sandboxes,
    images: {
      resolveImage: (ref) => images.resolveImage(ref),
      rootfsSourceFor: (id) => images.rootfsSourceFor(id),
      imageConfig: (id) => images.imageConfig(id),
    },
    host,
    readPcieFacts,
    guests,
  });
  const images = new ImageService({
    stateDir: config.stateDir,
    registriesConfigPath: config.images.registriesConfigPath,
    logger,
    isImageInUse: (imageId) => containers.isImageInUse(imageId),
    layersInUse: () => containers.layersInUse(),
  });
  const resize = new ResourceUpdates({ config, host, sandboxes, containers, store: containerStore });
  await sandboxes.recover();
  await containers.recover();
  await images.init();
  await logOrphans(config, logger);
  const containerStatuses = (sandboxId: string) => containers.inSandbox(sandboxId).map(containerStatusView);
  const stats = new StatsCollector(containers, guests);
  const targets = streamingTargets(containers, sandboxes, guests);
  let streaming: StreamingServer;
  try {
    streaming = await StreamingServer.start({ ...config.streaming, targets, logger });
  } catch (err) {
    await containers.close();
    sandboxes.close();
    images.close();
    throw err;
  }
  logger.info({ url: streaming.baseUrl }, 'streaming server listening');

  const runtimeHandlers: RuntimeRpcHandlers = {
    Version: async () => versionResponse(),
    Status: async (req: StatusRequest__Output) => {
      const response = statusResponse(config, facts, req, await networkReadiness(config.network));
      if (req.verbose) {
        response.info = {
          ...response.info,
          streaming: JSON.stringify({ url: streaming.baseUrl }),
          pool: JSON.stringify(pool.status()),
          templates: JSON.stringify(templates.status()),
        };
      }
      return response;
    },
    RuntimeConfig: async () => runtimeConfigResponse(facts),
    UpdateRuntimeConfig: async (req: UpdateRuntimeConfigRequest__Output, ctx) => updateRuntimeConfig(req, ctx),
    ...sandboxHandlers(sandboxes, (live) => containerStatuses(live.record.id), stats),
    ...containerHandlers(containers, resize, stats),
    ...streamingHandlers(streaming, targets),
    ...RUNTIME_RPCS_NOT_IMPLEMENTED,
  };

  let endpoint: MetricsEndpoint | undefined;
  let server: CriServer | undefined;
  try {
    if (config.metricsAddress !== null) endpoint = await serveMetrics(config.metricsAddress, metrics, logger);
    server = await startCriServer({
      socketPath: config.socketPath,
      logger,
      metrics,
      services: [
        {
          name: 'runtime.v1.RuntimeService',
          definition: cri.runtimeService,
          handlers: runtimeHandlers,
          streams: containerStreamHandlers(containers, (id) => {
            const live = sandboxes.find(id);
            return live === undefined ? null : podSandboxStatusView(live.record);
          }),
        },
        { name: 'runtime.v1.ImageService', definition: cri.imageService, handlers: imageServiceHandlers(images) },
      ],
    });
  } catch (err) {
    await endpoint?.close();
    await streaming.close();
    await containers.close();
    sandboxes.close();
    images.close();
    throw err;
  }
  const started = server;
  // The pool fills once the daemon answers: its boots never delay the daemon's start.
  pool.start();
  templates.start().catch((err: unknown) => logger.error({ err: errorMessage(err) }, 'templates could not start'));
  return {
    config,
    facts,
    socketPath: config.socketPath,
    metricsAddress: endpoint?.address ?? null,
    metrics,
    streamingUrl: streaming.baseUrl,
    pool,
    pods: {
      pause: (id, ctx) => pausePod({ sandboxes, containers }, id, ctx),
      resume: (id, ctx) => resumePod({ sandboxes }, id, ctx),
    },
    close: async () => {
      await pool.close();
      await templates.close();
      await started.close();
      await streaming.close();
      await endpoint?.close();
      await containers.close();
      sandboxes.close();
      images.close();
      await releaseLock();
      logger.info('kata-ts stopped');
    },
  };
}

/**
 * After recovery, list (never remove) what no record owns under the daemon's roots: what recovery
 * could not tie to a record is for an operator to look at, one warning each.
 */
async function logOrphans(config: KataConfig, logger: Logger): Promise<void> {
  try {
    const orphans = await auditOrphans(await ownersFromRecords(config.stateDir), {
      stateDir: config.stateDir,
      cgroupRoot: config.cgroupRoot,
      netnsDir: NETNS_DIR,
    });
    for (const orphan of orphans) logger.warn({ orphan }, 'orphan: no record owns it');
    logger.info({ orphans: orphans.length }, 'orphan audit done');
  } catch (err) {
    logger.warn({ err: errorMessage(err) }, 'orphan audit failed');
  }
}
