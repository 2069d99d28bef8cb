import { AgentClient, AgentConnection } from '../../agent-client/index.js';
import { errorMessage, type KataError } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { packageVersion } from '../../common/paths.js';
import type { AgentKeepaliveConfig } from '../../config/types.js';

/** The connection's keepalive options from the config's `hypervisor.agentKeepalive` (the connection's defaults without one). */
function keepaliveOptions(keepalive: AgentKeepaliveConfig | undefined): { keepaliveIntervalMs?: number; keepaliveMisses?: number } {
  return keepalive === undefined ? {} : { keepaliveIntervalMs: keepalive.intervalMs, keepaliveMisses: keepalive.misses };
}

/**
 * Connect the host's client to a guest agent through QEMU's socket for its virtio-serial port
 * and complete Hello (the API version check) within `timeoutMs`. The connection re-dials by
 * itself when a session drops (agent restart, daemon restart on the other side of the socket).
 */
export function connectAgentClient(
  socketPath: string,
  logger: Logger,
  timeoutMs: number,
  signal?: AbortSignal,
  keepalive?: AgentKeepaliveConfig,
): Promise<AgentClient> {
  return AgentClient.connect(
    { socketPath, logger: logger.child({ component: 'agent-client' }), hostVersion: packageVersion(), ...keepaliveOptions(keepalive) },
    timeoutMs,
    signal,
  );
}

/**
 * After a daemon restart: a client for an agent that kept running, connecting in the background
 * (a new session, the same agent instance). Recovery does not wait for it: calls wait for the
 * session within their own deadlines, and a guest whose agent does not answer only makes those
 * calls fail. `hold`: the pod is paused (see AgentConnection.hold).
 */
export function reopenAgentClient(
  socketPath: string,
  logger: Logger,
  hold?: () => KataError,
  keepalive?: AgentKeepaliveConfig,
): AgentClient {
  const connection = new AgentConnection({
    socketPath,
    logger: logger.child({ component: 'agent-client' }),
    hostVersion: packageVersion(),
    ...keepaliveOptions(keepalive),
  });
  // A paused pod's agent (pause.ts): held before the first dial, so no HELLO queues in a stopped guest.
  if (hold !== undefined) connection.hold(hold);
  connection.start(RECONNECT_WAIT_MS).catch((err: unknown) => {
    // A held (paused) pod's agent is not dialled until it is resumed: nothing to warn about.
    if (!connection.held) logger.warn({ err: errorMessage(err) }, 'the agent has not answered yet; still trying');
  });
  return new AgentClient(connection);
}

/** How long recovery's background connect waits before it logs that the agent is silent (it keeps trying). */
const RECONNECT_WAIT_MS = 30_000;
