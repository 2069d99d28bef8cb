/**
 * The per-pod shim process (`containerd-shim-kata-ts-v2 ... serve`, started detached by `start`):
 * it holds the pod's state dir, composes the pod's core on it, serves ttrpc on the pod's socket
 * (the services are registered by a callback: the Task service lives in task-service.ts), and
 * runs until containerd asks it to shut down with no task left, or a signal ends it.
 *
 * How it ends decides what stays:
 * - **shutdown** (containerd's Task.Shutdown once every task is deleted): nothing of the pod is
 *   left, so its state dir and socket go, and the process exits 0;
 * - **SIGTERM / SIGINT**: the server closes (calls in flight are answered first, within a grace),
 *   the socket goes, and the pod's VM and state stay as they are: containerd, seeing the shim
 *   gone, runs `delete`, which finds them from the state dir.
 *
 * A request never brings the process down (the ttrpc server answers a throwing handler with a
 * status), and an error nobody caught is logged rather than fatal: the pod's VM outlives this
 * process anyway, but containerd would lose its handle on the pod.
 */
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { detectCgroupDriver } from '../cgroups/index.js';
import { errnoCode, errorMessage, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { LoadedConfig } from '../config/types.js';
import { runningRelease } from '../release/layout.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import { releaseSharedMounts } from '../runtime/sandbox/shared-dir.js';
import { acquireStateLock, type StateLock } from '../runtime/state-lock.js';
import { TtrpcServer } from '../ttrpc/index.js';
import { readBundleConfig } from './bundle.js';
import { handlerForBinary } from './handler.js';
import { type MetricsEndpoint, PodMetrics, serveMetricsSocket } from './metrics-endpoint.js';
import { metricsSocketPath, type NodeShimInfo, readShimInfo, type ShimInfo, UPSTREAM_GONE_SUFFIX, writeShimInfo } from './paths.js';
import { composePod, podCgroupDriver, type ShimPod } from './pod.js';
import './reasons.js';

/** Who this shim is, as containerd started it: what a service needs besides the pod's core. */
export interface ShimIdentity {
  namespace: string;
  sandboxId: string;
  /** The sandbox's bundle. */
  bundle: string;
  /** The pod's ttrpc socket path. */
  socketPath: string;
  /** containerd's gRPC address (`-address`, or GRPC_ADDRESS). */
  containerdAddress: string;
  /** containerd's ttrpc address (TTRPC_ADDRESS): where task events are forwarded. */
  ttrpcAddress: string;
  /** `-publish-binary`: containerd's own binary (containerd 1.x shims published events with it). */
  publishBinary: string;
  debug: boolean;
  logger: Logger;
}

/**
 * Registers the services the pod's server answers (the Task service) before it listens.
 * `shutdown()` asks the shim to exit: it does (after the current call is answered) and returns
 * true when the pod holds no task any more, else it only logs and returns false.
 */
export type RegisterServices = (
  server: TtrpcServer,
  pod: ShimPod,
  shutdown: () => boolean,
  shim: ShimIdentity,
  /** Node mode: how the pod is served behind its relay; undefined in `pod` mode. */
  node?: NodeShimInfo,
) => RegisteredServices | undefined | Promise<RegisteredServices | undefined>;

/** What registered services hold beyond the server: closed once the server has answered its last call. */
export interface RegisteredServices {
  close(): Promise<void>;
}

/** No services at all: a server that only answers UNIMPLEMENTED (tests, and until the Task service is wired). */
export const registerNoServices: RegisterServices = () => undefined;

export interface ServeOptions {
  loaded: LoadedConfig;
  /** The pod's state dir (paths.ts podStateDir). */
  stateDir: string;
  identity: ShimIdentity;
  registerServices: RegisterServices;
  /** Facts decided by the caller (tests); gathered from the host when absent. */
  facts?: RuntimeFacts;
  /** How long calls in flight may take to be answered when the server closes (default 5 s). */
  closeGraceMs?: number;
  /**
   * Node mode (node-server.ts): the pod's server listens on the pod's upstream socket, behind
   * its relay (which listens on `identity.socketPath`), and `shim.json` says so.
   */
  node?: NodePodServing;
}

/** How a pod hosted by the node shim server is served (see ServeOptions.node). */
export interface NodePodServing {
  info: NodeShimInfo;
  /**
   * Called once the pod is shut down for good (its server closed, its core let go), before its
   * state dir goes: the relay is ended here and its socket removed.
   */
  onGone(): Promise<void>;
}

export type ShimEnd = 'shutdown' | 'signal';

/** A serving pod shim. */
export interface ShimServer {
  readonly server: TtrpcServer;
  readonly pod: ShimPod;
  readonly info: ShimInfo;
  /** Settles once the server has stopped and the pod is let go, with why. */
  readonly done: Promise<ShimEnd>;
  /** What the services' `shutdown` does: exit when no task is left (true), else nothing (false). */
  requestShutdown(): boolean;
  /** Stop serving, leaving the pod's VM and state for `delete` (a signal). */
  stop(): Promise<ShimEnd>;
}

function accepts(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect(socketPath);
    sock.once('connect', () => {
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => resolve(false));
  });
}

/** Where the pod's ttrpc server listens: its upstream socket in node mode, else the pod's socket. */
function listenPathOf(options: ServeOptions): string {
  return options.node?.info.upstream ?? options.identity.socketPath;
}

/** Remove a socket file left by a shim that is gone; refuse when something still answers on it. */
async function clearStaleSocket(socketPath: string): Promise<void> {
  if (await accepts(socketPath)) {
    throw unavailable('SHIM_SERVE_FAILED', `socket ${socketPath} is already served by another shim.`);
  }
  await fsp.rm(socketPath, { force: true });
}

/** Hold the pod's state dir, compose the pod, register the services, listen, write shim.json. */
export async function startShimServer(options: ServeOptions): Promise<ShimServer> {
  const { identity, stateDir } = options;
  const log = identity.logger;
  const lock = await acquireStateLock(stateDir, log);
  let pod: ShimPod | undefined;
  let server: TtrpcServer | undefined;
  let metrics: MetricsEndpoint | undefined;
  try {
    const previous = await readShimInfo(stateDir);
    if (previous !== undefined && previous.sandboxId !== identity.sandboxId) {
      throw unavailable(
        'SHIM_POD_DIR_TAKEN',
        `state dir ${stateDir} belongs to sandbox ${previous.sandboxId}, not ${identity.sandboxId} (their ids share 16 characters).`,
      );
    }
    const bundle = await readBundleConfig(identity.bundle);
    pod = await composePod({
      loaded: options.loaded,
      stateDir,
      cgroupDriver: podCgroupDriver(
        options.loaded.config.cgroupDriver,
        bundle.cgroupsPath,
        await detectCgroupDriver('auto', options.loaded.config.systemdRuntimeDir),
      ),
      logger: log,
      ...(options.facts === undefined ? {} : { facts: options.facts }),
    });
    await pod.recover();
    server = new TtrpcServer({ logger: log });
    const control = new Control(server, pod, lock, options);
    control.services = await options.registerServices(server, pod, () => control.requestShutdown(), identity, options.node?.info);
    // The metrics socket first: `start` returns once the ttrpc socket answers, and whoever it
    // answers reads shim.json next, so nothing may come between listening and writing it.
    metrics = await startPodMetrics(pod, identity, stateDir);
    control.metrics = metrics;
    const listenPath = listenPathOf(options);
    await fsp.mkdir(path.dirname(listenPath), { recursive: true, mode: 0o700 });
    // A node-mode pod shut down before left its gone marker: this server is a new life.
    if (options.node !== undefined) await fsp.rm(`${listenPath}${UPSTREAM_GONE_SUFFIX}`, { force: true });
    await clearStaleSocket(listenPath);
    await server.listen(listenPath);
    await fsp.chmod(listenPath, 0o600);
    const info: ShimInfo = {
      pid: process.pid,
      sandboxId: identity.sandboxId,
      namespace: identity.namespace,
      bundle: identity.bundle,
      socket: identity.socketPath,
      cgroupDriver: pod.facts.cgroupDriver.name,
      startedAt: new Date().toISOString(),
      release: runningRelease(),
      ...(options.node === undefined ? {} : { node: options.node.info }),
    };
    await writeShimInfo(stateDir, info);
    log.info({ socket: identity.socketPath, stateDir, tasks: pod.taskCount() }, 'shim serving');
    return control.serving(info);
  } catch (err) {
    server?.destroy();
    await metrics?.close().catch(() => undefined);
    await pod?.close().catch(() => undefined);
    await lock.release();
    throw err;
  }
}

/**
 * The pod's metrics socket (metrics-endpoint.ts); undefined when it cannot listen: metrics are
 * not worth failing a pod for (the reason is logged).
 */
async function startPodMetrics(pod: ShimPod, identity: ShimIdentity, stateDir: string): Promise<MetricsEndpoint | undefined> {
  const metrics = new PodMetrics({
    sandboxId: identity.sandboxId,
    namespace: identity.namespace,
    handler: handlerForBinary(process.argv[1] ?? '', Object.keys(pod.config.handlers)),
    findSandbox: (id) => pod.sandboxes.find(id),
    containers: () => pod.containers.list(null),
  });
  try {
    return await serveMetricsSocket(metricsSocketPath(stateDir), metrics, identity.logger);
  } catch (err) {
    identity.logger.warn({ err: errorMessage(err) }, 'the metrics socket could not listen: this pod has no metrics');
    return undefined;
  }
}

/** The end of a shim server: one stop, whichever asks first. */
class Control {
  private ending: Promise<ShimEnd> | undefined;
  /** The pod's metrics socket: closed (and removed) with the server. */
  metrics: MetricsEndpoint | undefined;
  /** What the registered services hold (the event publisher): closed after the server. */
  services: RegisteredServices | undefined;
  private resolveDone!: (end: ShimEnd) => void;
  readonly done = new Promise<ShimEnd>((resolve) => {
    this.resolveDone = resolve;
  });

  constructor(
    private readonly server: TtrpcServer,
    private readonly pod: ShimPod,
    private readonly lock: StateLock,
    private readonly options: ServeOptions,
  ) {}

  serving(info: ShimInfo): ShimServer {
    return {
      server: this.server,
      pod: this.pod,
      info,
      done: this.done,
      requestShutdown: () => this.requestShutdown(),
      stop: () => this.end('signal'),
    };
  }

  requestShutdown(): boolean {
    const log = this.options.identity.logger;
    const tasks = this.pod.taskCount();
    if (tasks > 0) {
      log.info({ tasks }, 'shutdown asked while the pod still holds tasks: staying');
      return false;
    }
    // Not awaited here: the call that asked is answered first (close waits for it).
    void this.end('shutdown');
    return true;
  }

  end(why: ShimEnd): Promise<ShimEnd> {
    this.ending ??= this.finish(why).then(
      () => {
        this.resolveDone(why);
        return why;
      },
      (err: unknown) => {
        this.options.identity.logger.error({ err: errorMessage(err) }, 'shim stop failed');
        this.resolveDone(why);
        return why;
      },
    );
    return this.ending;
  }

  private async finish(why: ShimEnd): Promise<void> {
    const { identity, stateDir } = this.options;
    const log = identity.logger;
    log.info({ why }, 'shim stopping');
    const listenPath = listenPathOf(this.options);
    const leaving = why === 'shutdown' && this.pod.taskCount() === 0;
    // The relay must learn that the upstream goes for good before it sees it close (it would revive it).
    if (this.options.node !== undefined && leaving) await fsp.writeFile(`${listenPath}${UPSTREAM_GONE_SUFFIX}`, '', { mode: 0o600 });
    const grace = new Promise<'late'>((resolve) => setTimeout(() => resolve('late'), this.options.closeGraceMs ?? 5_000).unref());
    if ((await Promise.race([this.server.close().then(() => 'closed' as const), grace])) === 'late') {
      log.warn('calls still running after the grace period: dropping their connections');
      this.server.destroy();
    }
    await this.services?.close().catch((err: unknown) => log.warn({ err: errorMessage(err) }, 'closing the services failed'));
    await this.metrics?.close().catch((err: unknown) => log.warn({ err: errorMessage(err) }, 'closing the metrics socket failed'));
    await this.pod.close();
    await fsp.rm(listenPath, { force: true });
    const gone = why === 'shutdown' && this.pod.taskCount() === 0;
    if (gone && this.options.node !== undefined) {
      await this.options.node.onGone().catch((err: unknown) => log.warn({ err: errorMessage(err) }, "ending the pod's relay failed"));
    }
    if (gone) {
      // Nothing may be deleted through a mount that is still there (see releaseSharedMounts).
      await releaseSharedMounts(stateDir, log);
      await this.lock.release();
      await fsp.rm(stateDir, { recursive: true, force: true });
      await fsp.rmdir(path.dirname(stateDir)).catch((err: unknown) => {
        if (errnoCode(err) !== 'ENOTEMPTY' && errnoCode(err) !== 'ENOENT') throw err;
      });
      log.info('shim stopped; the pod is gone');
    } else {
      await this.lock.release();
      log.info('shim stopped; the pod state stays for delete');
    }
  }
}

/**
 * Run the pod shim until it ends: SIGTERM and SIGINT stop it (the pod's VM stays), an error
 * nobody caught is logged. Resolves with the exit code.
 */
export async function runServe(options: ServeOptions): Promise<number> {
  const log = options.identity.logger;
  const onUncaught = (err: unknown) => log.error({ err: errorMessage(err) }, 'uncaught error (the shim keeps serving)');
  process.on('uncaughtException', onUncaught);
  process.on('unhandledRejection', onUncaught);
  // No terminal is ours (a session of our own): a hang-up means nothing here.
  const onHangup = () => log.info('SIGHUP ignored');
  process.on('SIGHUP', onHangup);
  let shim: ShimServer;
  try {
    shim = await startShimServer(options);
  } catch (err) {
    log.error({ err: errorMessage(err) }, 'shim failed to start');
    process.off('uncaughtException', onUncaught);
    process.off('unhandledRejection', onUncaught);
    process.off('SIGHUP', onHangup);
    throw err;
  }
  const onSignal = (signal: NodeJS.Signals) => {
    log.info({ signal }, 'signal received');
    void shim.stop();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  await shim.done;
  process.off('SIGTERM', onSignal);
  process.off('SIGINT', onSignal);
  process.off('SIGHUP', onHangup);
  process.off('uncaughtException', onUncaught);
  process.off('unhandledRejection', onUncaught);
  return 0;
}
