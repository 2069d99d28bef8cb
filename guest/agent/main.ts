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

import { readFileSync, realpathSync } from 'node:fs';
import { access } from 'node:fs/promises';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { cachedDataVersionTag } from 'node:v8';
import { ChannelServer, serveDuplex } from '../../src/channel/index.js';
import { createLogger, type LogLevel } from '../../src/common/logger.js';
import { type Attester, createAttester } from './attest/index.js';
import type { ContainerBackend } from './backend.js';
import { GUEST_ROOTS } from './containers/guest-facts.js';
import { Containers, CrunBackend, GUEST_PATHS } from './containers/index.js';
import { rootIsInitramfs } from './containers/runtime.js';
import { guestTrimSteps, hasReportingBalloon, IDLE_TRIM_DELAY_MS, IDLE_TRIM_MIN_INTERVAL_MS, IdleTrim } from './idle-trim.js';
import { GuestNetwork } from './network.js';
import { GUEST_POD_PATHS, GUEST_VIRTIO_DEVICES_DIR, PodService } from './pods.js';
import { AGENT_PORT_NAME, findPort, VirtioPort } from './port.js';
import { GuestReseed } from './reseed.js';
import { SecretVolumes } from './secret-volumes.js';
import { AgentService } from './server.js';
import type { TpmTransport } from './tpm.js';
import { GUEST_TPM_DEVICE, openTpmDevice } from './tpm-device.js';
import { measureInitdata } from './tpm-initdata.js';

export const AGENT_VERSION = '0.1.0';

/** Kernel uptime (CLOCK_BOOTTIME, /proc/uptime: 10 ms steps) in seconds; NaN where unreadable. */
export function guestUptimeS(): number {
  try {
    return Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
  } catch {
    return Number.NaN;
  }
}

/** Uptime when startAgent began: node started and the agent's code loaded (or deserialized). */
let startedAtS = Number.NaN;

/** Where the agent's code came from: V8's start-up snapshot, or the bundle parsed at start. */
export type AgentCodeSource = 'snapshot' | 'bundle';
let codeSource: AgentCodeSource = 'bundle';

/**
 * The agent's start on the guest's clock, logged with 'agent serving' (the console log on the
 * host; bench/agent-start.ts reads it): `launchedAtS` is the uptime when guest/init exec'd node
 * (KATA_TS_AGENT_LAUNCHED_AT), `startedAtS` when startAgent began (node and the agent's code are
 * up), `readyAtS` the uptime now, when the port is open and announced. `start` is init's count of
 * agent starts in this boot (KATA_TS_AGENT_START) and `codeSource` says whether this one came from
 * the start-up snapshot: a boot that logs start 2 from the bundle had its snapshot refused.
 * `v8Tag` is the tag node compares with the snapshot's (V8's version, flags and CPU features).
 */
export function agentStartTimes(env: NodeJS.ProcessEnv): {
  launchedAtS: number;
  startedAtS: number;
  readyAtS: number;
  agentStartMs: number;
  start: number;
  codeSource: AgentCodeSource;
  v8Tag: number;
} {
  const launchedAtS = Number(env.KATA_TS_AGENT_LAUNCHED_AT ?? Number.NaN);
  const readyAtS = guestUptimeS();
  const start = Number(env.KATA_TS_AGENT_START ?? Number.NaN);
  return {
    launchedAtS,
    startedAtS,
    readyAtS,
    agentStartMs: Math.round((readyAtS - launchedAtS) * 1000),
    start,
    codeSource,
    v8Tag: cachedDataVersionTag(),
  };
}

function agentLogger(env: NodeJS.ProcessEnv) {
  return createLogger({ level: (env.KATA_TS_AGENT_LOG_LEVEL as LogLevel | undefined) ?? 'info' }).child({ component: 'guest-agent' });
}

/**
 * The guest's real backend: crun on the guest's cgroup2 (createGuestBackend's wiring), after
 * finding again the containers a previous agent left running (a restarted agent keeps them).
 * `--no-pivot` only when the root is still the initramfs (guest/init switches to a tmpfs root).
 */
export async function guestBackend(logger: ReturnType<typeof agentLogger>): Promise<ContainerBackend> {
  const noPivot = rootIsInitramfs(readFileSync('/proc/self/mountinfo', 'utf8'));
  const containers = new Containers({
    runtime: { command: [GUEST_PATHS.crun], stateDir: GUEST_PATHS.crunState, cgroupManager: 'cgroupfs', noPivot },
    bundlesDir: GUEST_PATHS.bundles,
    reaperPath: GUEST_PATHS.reaper,
    cgroupRoot: GUEST_ROOTS.cgroupRoot,
  });
  const recovered = await containers.recover();
  logger.info({ recovered, noPivot }, 'container backend ready');
  return new CrunBackend(containers, { roots: GUEST_ROOTS });
}

/** Run the agent with `backend` (and `pods`, the pod service) until the process ends. */
export async function runAgent(
  backend: ContainerBackend,
  env: NodeJS.ProcessEnv = process.env,
  pods?: PodService,
  logger = agentLogger(env),
  idleTrim?: IdleTrim,
  openTpm?: () => Promise<TpmTransport>,
  /** The pod's attester (guest/agent/attest): what containers' secrets are fetched through. */
  attester?: Attester,
): Promise<void> {
  // The network service comes with the pod service: both belong to a real guest.
  const service = new AgentService({
    backend,
    agentVersion: AGENT_VERSION,
    logger,
    ...(pods === undefined ? {} : { pods, network: new GuestNetwork(logger), reseed: new GuestReseed(logger) }),
    // A development agent on a unix socket runs on a host: never trim the host's memory.
    ...(idleTrim === undefined || env.KATA_TS_AGENT_LISTEN ? {} : { idleTrim }),
    ...(openTpm === undefined ? {} : { openTpm }),
    // Containers' secrets need a real guest (its /run, mount) and an attester to fetch them through.
    ...(pods === undefined || attester === undefined ? {} : { secrets: new SecretVolumes(logger, () => attester) }),
    // A broker on the pod network becomes reachable when the network is configured.
    ...(attester === undefined ? {} : { onNetworkConfigured: () => attester.nudge() }),
  });
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
  logger.info({ device, instanceId: service.instanceId, ...agentStartTimes(env) }, 'agent serving');
  // What boot and the agent's start left behind goes back once the guest is quiet (a pooled VM
  // waits for its claim with it trimmed).
  idleTrim?.note();
  await port.run(channel);
}

/** Serve crun containers and the pod service (what guest/init starts). */
export function startAgent(env: NodeJS.ProcessEnv = process.env, source: AgentCodeSource = 'bundle'): void {
  startedAtS = guestUptimeS();
  codeSource = source;
  // Again here: a snapshot (guest/agent/snapshot.ts) ran the line at the top at build time.
  env.UV_THREADPOOL_SIZE ??= '8';
  const logger = agentLogger(env);
  // Only in the real guest: the trim writes to the kernel's /proc/sys/vm.
  const idleTrim = new IdleTrim({
    delayMs: IDLE_TRIM_DELAY_MS,
    minIntervalMs: IDLE_TRIM_MIN_INTERVAL_MS,
    steps: guestTrimSteps(),
    logger,
    worthwhile: () => hasReportingBalloon(),
  });
  const openTpm = () => openTpmDevice();
  // The initdata document is measured (PCR 8) before anything else runs, so nothing the agent
  // starts can read it unmeasured. A failure leaves it unpublished and the agent serving.
  measureInitdata({
    logger,
    openTpm,
    hasTpm: () =>
      access(GUEST_TPM_DEVICE).then(
        () => true,
        () => false,
      ),
  })
    .catch((err: unknown) => logger.error({ err }, 'initdata not measured: not published'))
    .then(async () => {
      // Only after the initdata step: the attester reads the broker from the published (measured)
      // document, and attests at once in the background when it names one.
      const attester = createAttester({ openTpm, log: logger });
      attester.start();
      const backend = await guestBackend(logger);
      return runAgent(
        backend,
        env,
        new PodService(logger, { ...GUEST_POD_PATHS, virtioDevicesDir: GUEST_VIRTIO_DEVICES_DIR }),
        logger,
        idleTrim,
        openTpm,
        attester,
      );
    })
    .catch((err: unknown) => {
      process.stderr.write(`kata-ts-agent: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exit(1);
    });
}

// Started directly (not imported by a test, nor bundled into the start-up snapshot, whose entry
// guest/agent/snapshot.ts starts it): serve. A CommonJS bundle has no import.meta.url.
const selfUrl: string | undefined = import.meta.url;
if (selfUrl !== undefined && process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(selfUrl))) {
  startAgent();
}
