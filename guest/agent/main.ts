/**
 * The guest agent's entry point (bundled into the guest image and started by guest/init).
 *
 * Environment:
 *   UV_THREADPOOL_SIZE        libuv pool; the port holds one blocking read and one blocking
 *                             write, crun's file work needs the rest (set by init; 8 if unset)
 *   KATA_TS_AGENT_PORT        a device path to use instead of looking the port up by name
 *   KATA_TS_AGENT_LISTEN      a unix socket path to serve instead of a port (development)
 *   KATA_TS_AGENT_LOG_LEVEL   pino level, info by default; logs go to stderr (the console)
 */
process.env.UV_THREADPOOL_SIZE ??= '8';

import { realpathSync } from 'node:fs';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { ChannelServer, serveDuplex } from '../../src/channel/index.js';
import { createLogger, type LogLevel } from '../../src/common/logger.js';
import type { ContainerBackend } from './backend.js';
import { AGENT_PORT_NAME, findPort, VirtioPort } from './port.js';
import { AgentService } from './server.js';
import { unimplementedBackend } from './unimplemented-backend.js';

export const AGENT_VERSION = '0.1.0';

/** Run the agent with `backend` until the process ends. */
export async function runAgent(backend: ContainerBackend, env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const logger = createLogger({ level: (env.KATA_TS_AGENT_LOG_LEVEL as LogLevel | undefined) ?? 'info' }).child({
    component: 'guest-agent',
  });
  const service = new AgentService({ backend, agentVersion: AGENT_VERSION, logger });
  if (env.KATA_TS_AGENT_LISTEN) {
    const server = net.createServer((socket) => serveDuplex(socket, (session) => service.attach(session)));
    server.listen(env.KATA_TS_AGENT_LISTEN);
    logger.info({ path: env.KATA_TS_AGENT_LISTEN }, 'agent listening on a unix socket');
    return;
  }
  const device = env.KATA_TS_AGENT_PORT || (await findPort(AGENT_PORT_NAME));
  const port = await VirtioPort.open(device, logger);
  const channel = new ChannelServer(port, (session) => {
    logger.info('new host session');
    service.attach(session);
  });
  channel.announce();
  logger.info({ device, instanceId: service.instanceId }, 'agent serving');
  await port.run(channel);
}

// Started directly (not imported by a test): serve with the backend this build has.
if (process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url))) {
  runAgent(unimplementedBackend()).catch((err: unknown) => {
    process.stderr.write(`kata-ts-agent: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
