/**
 * The Task service wired into a pod's shim server: containerd's events publisher on
 * TTRPC_ADDRESS, the pod's tasks, and one method table served under the task API's v2 and v3 names.
 */
import { detectCgroupMode } from '../cgroups/index.js';
import { packageVersion } from '../common/paths.js';
import { EventPublisher } from './events.js';
import { handlerForBinary } from './handler.js';
import type { MetricsVersion } from './metrics.js';
import { outputHolder } from './node-output-holder.js';
import { defaultRelayBinary } from './node-relay.js';
import { serviceMethods, TASK_SERVICE_NAMES, TASK_SERVICE_V2 } from './proto.js';
import { SANDBOX_SERVICE, sandboxHandlers } from './sandbox-service.js';
import type { RegisterServices } from './serve.js';
import { taskHandlers } from './task-service.js';
import { ShimTasks } from './tasks.js';

/** How long the last events may take to reach containerd when the shim ends. */
const EVENTS_FLUSH_MS = 5_000;

export { handlerForBinary };

export const registerTaskService: RegisterServices = async (server, pod, shutdown, shim, node) => {
  const logger = shim.logger;
  const events = new EventPublisher({ address: shim.ttrpcAddress, namespace: shim.namespace, logger });
  const handler = handlerForBinary(process.argv[1] ?? '', Object.keys(pod.config.handlers));
  // Node mode: containerd's output FIFOs are held by a process that outlives a crash of the node server.
  const holder = node === undefined ? undefined : outputHolder(defaultRelayBinary(), logger);
  const tasks = new ShimTasks({
    pod,
    events,
    handler,
    logger,
    namespace: shim.namespace,
    ...(holder === undefined ? {} : { outputHolder: holder }),
  });
  // A pod served again after its shim died (node mode) has tasks containerd still knows.
  await tasks.recover();
  const mode = await detectCgroupMode(pod.config.cgroupRoot).catch(() => 'v1' as const);
  const metricsVersion: MetricsVersion = mode === 'v2' ? 'v2' : 'v1';
  const methods = serviceMethods(
    TASK_SERVICE_V2,
    taskHandlers({
      tasks,
      stats: pod.stats,
      sandboxes: pod.sandboxes,
      logger,
      metricsVersion,
      shutdown: () => void shutdown(),
      version: `kata-ts ${packageVersion()}`,
    }),
  );
  for (const name of TASK_SERVICE_NAMES) server.register(name, methods);
  // containerd 2.x's Sandbox API, called only for a runtime with `sandboxer = "shim"`.
  server.register(
    SANDBOX_SERVICE,
    serviceMethods(
      SANDBOX_SERVICE,
      sandboxHandlers({ tasks, pod, stats: pod.stats, logger, metricsVersion, sandboxId: shim.sandboxId, shutdown: () => void shutdown() }),
    ),
  );
  logger.info({ handler, metricsVersion }, 'task and sandbox services registered');
  return {
    close: async () => {
      tasks.close();
      await events.close(EVENTS_FLUSH_MS);
    },
  };
};
