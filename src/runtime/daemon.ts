import type { Logger } from '../common/logger.js';
import type { KataConfig, LoadedConfig } from '../config/types.js';
import type { StatusRequest__Output } from '../generated/runtime/v1/StatusRequest.js';
import type { UpdateRuntimeConfigRequest__Output } from '../generated/runtime/v1/UpdateRuntimeConfigRequest.js';
import { loadCriPackage } from './cri/proto.js';
import { runtimeConfigResponse, statusResponse, updateRuntimeConfig, versionResponse } from './cri/runtime-info.js';
import { startCriServer, type CriServer, type HandlerMap } from './cri/server.js';
import type { RuntimeFacts } from './facts.js';
import { gatherFacts } from './gather-facts.js';
import { RuntimeMetrics, serveMetrics, type MetricsEndpoint } from './metrics.js';

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
  /** Stop serving. Pod VMs keep running: they are found again by the next start. */
  close(): Promise<void>;
}

/** Compose and start the daemon from a loaded config. */
export async function startDaemon(options: DaemonOptions): Promise<Daemon> {
  const { config } = options.loaded;
  const logger = options.logger;
  const facts = options.facts ?? (await gatherFacts(options.loaded));
  logger.info(
    { configPath: facts.configPath, accel: facts.acceleration, cgroupDriver: facts.cgroupDriver, qemu: facts.qemu, guestAssets: facts.guestAssets },
    'kata-ts starting',
  );
  const metrics = new RuntimeMetrics();
  const cri = loadCriPackage();

  const runtimeHandlers: HandlerMap = {
    Version: async () => versionResponse(),
    Status: async (req: StatusRequest__Output) => statusResponse(config, facts, req),
    RuntimeConfig: async () => runtimeConfigResponse(facts),
    UpdateRuntimeConfig: async (req: UpdateRuntimeConfigRequest__Output, ctx) => updateRuntimeConfig(req, ctx),
  };
  const imageHandlers: HandlerMap = {};

  let endpoint: MetricsEndpoint | undefined;
  let server: CriServer | undefined;
  try {
    if (config.metricsAddress !== null) endpoint = await serveMetrics(config.metricsAddress, metrics, logger);
    server = await startCriServer({
      socketPath: config.socketPath,
      logger,
      metrics,
      services: [
        { name: 'runtime.v1.RuntimeService', definition: cri.runtimeService, handlers: runtimeHandlers },
        { name: 'runtime.v1.ImageService', definition: cri.imageService, handlers: imageHandlers },
      ],
    });
  } catch (err) {
    await endpoint?.close();
    throw err;
  }
  const started = server;
  return {
    config,
    facts,
    socketPath: config.socketPath,
    metricsAddress: endpoint?.address ?? null,
    metrics,
    close: async () => {
      await started.close();
      await endpoint?.close();
      logger.info('kata-ts stopped');
    },
  };
}
