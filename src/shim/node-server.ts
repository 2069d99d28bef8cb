/**
 * The node shim server (`containerd-shim-kata-ts-v2 ... node-serve`, shim.mode "node"; see
 * docs/shim.md "Shim modes"): one Node process per (shim.stateRoot, containerd address) that
 * hosts the core of every pod of that containerd, each pod served by the per-pod server code
 * (serve.ts startShimServer) on the pod's upstream socket `<podStateDir>/upstream.sock`. containerd
 * talks to each pod's relay (node-relay.ts), never to this process, so this process may die: the
 * relays keep containerd's connections, revive it, and replay what was not answered.
 *
 * - **Singleton** by the lock `<stateRoot>/node/<key>/daemon.lock` (paths.ts nodeServerPaths): a
 *   second one finds it held and exits 0 (starts and revives may race).
 * - **Control socket** `<dir>/ctl.sock` (0600), JSON lines, one answer line per request:
 *   `{"attach":{"namespace","sandboxId","bundle","socketPath"}}` hosts the pod (again: an attached
 *   pod is answered ok), `{"detach":{"namespace","sandboxId"}}` lets it go with its VM and state
 *   kept (what `delete` asks before it cleans up); answered `{"ok":true}` or
 *   `{"error":{"code","message"}}`.
 * - **Recovery**: on start, every pod whose `shim.json` names node mode and this containerd is
 *   attached again (its VM kept running meanwhile).
 * - A pod's **shutdown** (containerd's Task.Shutdown with no task left) ends that pod only; the
 *   process exits after IDLE_EXIT_MS with no pod, and on SIGTERM (its pods' VMs and state stay).
 */
import fs, { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { errorMessage, invalid, isReason, KataError, unavailable } from '../common/errors.js';
import type { Logger, LogLevel } from '../common/logger.js';
import type { LoadedConfig } from '../config/types.js';
import { acquireStateLock, type StateLock } from '../runtime/state-lock.js';
import { openShimLog, shimLogger } from './log.js';
import { chargeRelayToPod, endRelay, leavePodCgroup, livingRelayPid, relayGone, unchargeRelay } from './node-relay.js';
import {
  NODE_REVIVE_LOCK_FILE,
  nodeServerPaths,
  podStateDir,
  RELAY_PID_FILE,
  readShimInfo,
  shimSocketPath,
  upstreamSocketPath,
  validateId,
  validateNamespace,
} from './paths.js';
import { type RegisterServices, type ShimServer, startShimServer } from './serve.js';
import './reasons.js';

/** How long the node server stays with no pod before it exits. */
export const IDLE_EXIT_MS = 30_000;
/** Control request lines longer than this are refused (an attach is a few hundred bytes). */
const MAX_REQUEST_BYTES = 64 * 1024;
/** How often a pod's relay is looked for to be charged to the pod's cgroup. */
const CHARGE_POLL_MS = 1_000;
/** How long a shut-down pod's relay gets to leave by itself before it is ended. */
const RELAY_LEAVE_MS = 3_000;

export interface NodeServeOptions {
  loaded: LoadedConfig;
  containerdAddress: string;
  ttrpcAddress: string;
  publishBinary: string;
  debug: boolean;
  registerServices: RegisterServices;
  /** The node server's own log (pods log to their own shim logs). */
  logger: Logger;
  idleExitMs?: number;
}

/** A control request, checked. */
export type NodeRequest =
  | { attach: { namespace: string; sandboxId: string; bundle: string; socketPath: string } }
  | { detach: { namespace: string; sandboxId: string } };

function field(o: Record<string, unknown>, name: string, where: string): string {
  const v = o[name];
  if (typeof v !== 'string' || v === '') {
    throw invalid('SHIM_NODE_REQUEST_INVALID', `${where}.${name} must be a non-empty string.`, { details: { field: `${where}.${name}` } });
  }
  return v;
}

/** Parse one control line; throws SHIM_NODE_REQUEST_INVALID naming the field. */
export function parseNodeRequest(line: string): NodeRequest {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    throw invalid('SHIM_NODE_REQUEST_INVALID', 'the control request is not JSON.');
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw invalid('SHIM_NODE_REQUEST_INVALID', 'the control request is not an object.');
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o);
  if (keys.length !== 1) throw invalid('SHIM_NODE_REQUEST_INVALID', 'the control request must hold exactly one of attach, detach.');
  const body = o[keys[0]!];
  if (typeof body !== 'object' || body === null) throw invalid('SHIM_NODE_REQUEST_INVALID', `${keys[0]} must be an object.`);
  const b = body as Record<string, unknown>;
  if (keys[0] === 'attach') {
    return {
      attach: {
        namespace: field(b, 'namespace', 'attach'),
        sandboxId: field(b, 'sandboxId', 'attach'),
        bundle: field(b, 'bundle', 'attach'),
        socketPath: field(b, 'socketPath', 'attach'),
      },
    };
  }
  if (keys[0] === 'detach') return { detach: { namespace: field(b, 'namespace', 'detach'), sandboxId: field(b, 'sandboxId', 'detach') } };
  throw invalid('SHIM_NODE_REQUEST_INVALID', `unknown control request "${keys[0]}"; requests: attach, detach.`);
}

interface HostedPod {
  shim: ShimServer;
  stop: AbortController;
  logFd: number;
}

/** Run the node server until it has had no pod for IDLE_EXIT_MS, or a signal ends it. Resolves with the exit code. */
export async function runNodeServe(options: NodeServeOptions): Promise<number> {
  const log = options.logger;
  const stateRoot = options.loaded.config.shim.stateRoot;
  const paths = nodeServerPaths(stateRoot, options.containerdAddress);
  let lock: StateLock;
  try {
    lock = await acquireStateLock(paths.dir, log);
  } catch (err) {
    if (isReason(err, 'STATE_DIR_LOCKED')) {
      log.info({ dir: paths.dir }, 'a node shim server already runs for this containerd');
      return 0;
    }
    throw err;
  }
  const node = new NodeServer(options, paths.control, log);
  const onUncaught = (err: unknown) => log.error({ err: errorMessage(err) }, 'uncaught error (the node shim keeps serving)');
  process.on('uncaughtException', onUncaught);
  process.on('unhandledRejection', onUncaught);
  process.on('SIGHUP', () => log.info('SIGHUP ignored'));
  const onSignal = (signal: NodeJS.Signals) => {
    log.info({ signal }, 'signal received: stopping every pod (their VMs and state stay)');
    void node.stopAll();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  try {
    await node.listen();
    await node.reattachAll(stateRoot);
    await node.ended;
  } finally {
    await node.close();
    await lock.release();
  }
  return 0;
}

class NodeServer {
  private readonly pods = new Map<string, HostedPod>();
  private readonly pending = new Map<string, Promise<void>>();
  private ctl: net.Server | undefined;
  private idle: NodeJS.Timeout | undefined;
  private stopping = false;
  private resolveEnded!: () => void;
  readonly ended = new Promise<void>((resolve) => {
    this.resolveEnded = resolve;
  });

  constructor(
    private readonly options: NodeServeOptions,
    private readonly controlPath: string,
    private readonly log: Logger,
  ) {}

  async listen(): Promise<void> {
    // The lock is ours: a socket file here is a dead server's.
    await fsp.rm(this.controlPath, { force: true });
    const server = net.createServer((sock) => this.onConnection(sock));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.controlPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    await fsp.chmod(this.controlPath, 0o600);
    this.ctl = server;
    this.log.info({ control: this.controlPath }, 'node shim server listening');
    this.checkIdle();
  }

  private onConnection(sock: net.Socket): void {
    let buf = '';
    sock.setEncoding('utf8');
    sock.on('error', () => undefined);
    sock.on('data', (chunk: string) => {
      buf += chunk;
      if (buf.length > MAX_REQUEST_BYTES) {
        sock.end(`${JSON.stringify({ error: { code: 'SHIM_NODE_REQUEST_INVALID', message: 'the control request is too long.' } })}\n`);
        return;
      }
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        void this.answer(line).then((answer) => {
          if (!sock.destroyed) sock.write(`${JSON.stringify(answer)}\n`);
        });
      }
    });
  }

  private async answer(line: string): Promise<unknown> {
    try {
      const req = parseNodeRequest(line);
      if ('attach' in req) await this.attach(req.attach);
      else await this.detach(req.detach.namespace, req.detach.sandboxId);
      return { ok: true };
    } catch (err) {
      const code = err instanceof KataError ? err.reason : 'SHIM_NODE_FAILED';
      return { error: { code, message: errorMessage(err) } };
    }
  }

  /** Host the pod (once: a second attach of a hosted or attaching pod waits for the first). */
  async attach(req: { namespace: string; sandboxId: string; bundle: string; socketPath: string }): Promise<void> {
    validateNamespace(req.namespace);
    validateId(req.sandboxId, 'attach.sandboxId');
    const key = `${req.namespace}/${req.sandboxId}`;
    if (this.stopping) throw unavailable('SHIM_NODE_FAILED', 'the node shim server is stopping; attach again to start a new one.');
    if (this.pods.has(key)) return;
    const inFlight = this.pending.get(key);
    if (inFlight !== undefined) return inFlight;
    const p = this.host(req, key).finally(() => this.pending.delete(key));
    this.pending.set(key, p);
    return p;
  }

  private async host(req: { namespace: string; sandboxId: string; bundle: string; socketPath: string }, key: string): Promise<void> {
    const { loaded } = this.options;
    const stateRoot = loaded.config.shim.stateRoot;
    const expected = shimSocketPath(stateRoot, this.options.containerdAddress, req.namespace, req.sandboxId);
    if (req.socketPath !== expected) {
      throw invalid('SHIM_NODE_REQUEST_INVALID', `attach.socketPath must be the pod's socket ${expected}, not ${req.socketPath}.`, {
        details: { field: 'attach.socketPath' },
      });
    }
    if (!path.isAbsolute(req.bundle))
      throw invalid('SHIM_NODE_REQUEST_INVALID', `attach.bundle must be an absolute path, not ${req.bundle}.`);
    const stateDir = podStateDir(stateRoot, req.namespace, req.sandboxId);
    const target = await openShimLog(req.bundle, stateDir);
    const level: LogLevel = this.options.debug ? 'debug' : loaded.config.logLevel;
    const logger = shimLogger(target.fd, level, { namespace: req.namespace, sandboxId: req.sandboxId });
    const relayPidFile = path.join(stateDir, RELAY_PID_FILE);
    const upstream = upstreamSocketPath(stateDir);
    let shim: ShimServer;
    try {
      shim = await startShimServer({
        loaded,
        stateDir,
        registerServices: this.options.registerServices,
        identity: {
          namespace: req.namespace,
          sandboxId: req.sandboxId,
          bundle: req.bundle,
          socketPath: req.socketPath,
          containerdAddress: this.options.containerdAddress,
          ttrpcAddress: this.options.ttrpcAddress,
          publishBinary: this.options.publishBinary,
          debug: this.options.debug,
          logger,
        },
        node: {
          info: { containerdAddress: this.options.containerdAddress, upstream, relayPidFile },
          onGone: async () => {
            // The relay leaves by itself once it sees the gone marker; one that stays is ended.
            await unchargeRelay(stateDir).catch((err: unknown) =>
              logger.warn({ err: errorMessage(err) }, 'the relay could not be moved back'),
            );
            if (!(await relayGone(relayPidFile, req.socketPath, RELAY_LEAVE_MS))) await endRelay(relayPidFile, req.socketPath);
            await fsp.rm(req.socketPath, { force: true });
          },
        },
      });
    } catch (err) {
      fs.closeSync(target.fd);
      throw err;
    }
    const placement = shim.pod.sandboxes.find(req.sandboxId)?.record.placement;
    if (placement != null) {
      // Revived by this pod's relay, this process started in the pod's VMM cgroup: out of it.
      await leavePodCgroup(stateDir, placement).then(
        (moved) => moved && this.log.info({ sandboxId: req.sandboxId }, "the node server left the pod's cgroup it was revived in"),
        (err: unknown) =>
          this.log.warn({ sandboxId: req.sandboxId, err: errorMessage(err) }, "the node server could not leave the pod's cgroup"),
      );
    }
    const stop = new AbortController();
    this.pods.set(key, { shim, stop, logFd: target.fd });
    this.checkIdle();
    this.log.info({ namespace: req.namespace, sandboxId: req.sandboxId, pods: this.pods.size }, 'pod attached');
    void this.chargeRelay(shim, stateDir, relayPidFile, req.socketPath, stop.signal, logger);
    void shim.done.then((why) => {
      stop.abort();
      this.pods.delete(key);
      fs.closeSync(target.fd);
      this.log.info({ namespace: req.namespace, sandboxId: req.sandboxId, why, pods: this.pods.size }, 'pod let go');
      this.checkIdle();
    });
  }

  /**
   * Charge the pod's relay to the cgroup its VMM was placed in once both exist, and move it back
   * once the VM has stopped (see node-relay.ts). Failures are logged: accounting is not worth a pod.
   */
  private async chargeRelay(
    shim: ShimServer,
    stateDir: string,
    pidFile: string,
    listen: string,
    signal: AbortSignal,
    logger: Logger,
  ): Promise<void> {
    const sandboxId = shim.info.sandboxId;
    try {
      for (;;) {
        if (signal.aborted) return;
        const record = shim.pod.sandboxes.find(sandboxId)?.record;
        const relayPid = await livingRelayPid(pidFile, listen);
        const vmmPid = record?.vmm?.pid;
        if (record?.placement != null && relayPid !== undefined && typeof vmmPid === 'number') {
          if (await chargeRelayToPod(stateDir, relayPid, vmmPid, record.placement))
            logger.info({ relayPid }, "relay charged to the pod's cgroup");
          break;
        }
        await new Promise((r) => setTimeout(r, CHARGE_POLL_MS).unref());
      }
      await shim.pod.sandboxExited(sandboxId, signal).catch(() => undefined);
      if (signal.aborted) return;
      await unchargeRelay(stateDir);
      logger.info("the VM stopped: relay moved out of the pod's cgroup");
    } catch (err) {
      logger.warn({ err: errorMessage(err) }, "the relay's cgroup could not be changed");
    }
  }

  /** Stop hosting the pod; its VM and state stay (its `delete` cleans up next). */
  async detach(namespace: string, sandboxId: string): Promise<void> {
    validateNamespace(namespace);
    validateId(sandboxId, 'detach.sandboxId');
    const key = `${namespace}/${sandboxId}`;
    await this.pending.get(key)?.catch(() => undefined);
    const pod = this.pods.get(key);
    if (pod === undefined) return;
    await pod.shim.stop();
  }

  /** Attach every pod whose shim.json names node mode and this containerd (after a crash). */
  async reattachAll(stateRoot: string): Promise<void> {
    const namespaces = await fsp.readdir(stateRoot, { withFileTypes: true }).catch(() => []);
    for (const ns of namespaces) {
      if (!ns.isDirectory() || ns.name === 'node' || ns.name === 's') continue;
      const dirs = await fsp.readdir(path.join(stateRoot, ns.name)).catch(() => [] as string[]);
      // All at once: each pod's relay is waiting, and one pod's slow recovery must not hold up the others.
      await Promise.all(
        dirs.sort().map(async (dir) => {
          const info = await readShimInfo(path.join(stateRoot, ns.name, dir)).catch(() => undefined);
          if (info?.node?.containerdAddress !== this.options.containerdAddress) return;
          await this.attach({ namespace: info.namespace, sandboxId: info.sandboxId, bundle: info.bundle, socketPath: info.socket }).then(
            () => this.log.info({ sandboxId: info.sandboxId }, 'pod re-attached'),
            (err: unknown) => this.log.warn({ sandboxId: info.sandboxId, err: errorMessage(err) }, 'pod not re-attached'),
          );
        }),
      );
    }
    this.checkIdle();
  }

  private checkIdle(): void {
    if (this.idle !== undefined) {
      clearTimeout(this.idle);
      this.idle = undefined;
    }
    if (this.stopping || this.pods.size > 0 || this.pending.size > 0) return;
    this.idle = setTimeout(() => {
      if (this.pods.size > 0 || this.pending.size > 0) return;
      this.log.info('no pod for a while: the node shim server exits');
      this.stopping = true;
      this.resolveEnded();
    }, this.options.idleExitMs ?? IDLE_EXIT_MS);
  }

  /** Stop every pod (VMs and state stay) and end. */
  async stopAll(): Promise<void> {
    this.stopping = true;
    await Promise.all([...this.pending.values()].map((p) => p.catch(() => undefined)));
    await Promise.all([...this.pods.values()].map((p) => p.shim.stop()));
    this.resolveEnded();
  }

  async close(): Promise<void> {
    if (this.idle !== undefined) clearTimeout(this.idle);
    const ctl = this.ctl;
    this.ctl = undefined;
    if (ctl !== undefined) await new Promise<void>((resolve) => ctl.close(() => resolve()));
    await fsp.rm(this.controlPath, { force: true });
    // The relays' revive lock goes too (a revive still under way holds its own descriptor; the
    // server's daemon.lock, not this file, is what keeps a second server out).
    await fsp.rm(path.join(path.dirname(this.controlPath), NODE_REVIVE_LOCK_FILE), { force: true });
  }
}

/** The node server's own logger: logfmt lines appended to `file` (created 0600 with its directory). */
export function nodeServerLogger(file: string, level: LogLevel): Logger {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
  return shimLogger(fd, level, { node: true });
}
