/**
 * containerd's port-forward, reaching the guest (docs/shim.md#port-forward-behind-containerd).
 *
 * containerd answers CRI PortForward itself: it enters the pod's network namespace and dials
 * `127.0.0.1:<port>` (tcp4) there. Behind kata-ts nothing listens in that namespace, the container
 * listens in the guest. The door, made for a sandbox that joined containerd's namespace:
 * - kata-ts-portfwd (native/portfwd.c), started in the pod's namespace, listens on 127.0.0.1 at an
 *   ephemeral port and hands every connection it accepts to this process over `<pod state
 *   dir>/portfwd.sock`, preceded by the port the client dialled (read with SO_ORIGINAL_DST);
 * - one iptables nat OUTPUT rule in the pod's namespace redirects tcp to 127.0.0.1 on `lo` to that
 *   listener (only locally made connections inside that namespace: nothing of the host's network
 *   changes and no port opens to anything outside the namespace);
 * - here each handed connection becomes the agent's PortForward stream to that port on the guest's
 *   loopback, as the standalone door's port-forward does; the first byte back says whether the
 *   guest accepted (0) or refused (1: the helper resets the client's connection).
 * Made after the VM boots, removed when the sandbox stops; the helper ends when its stdin closes,
 * so a shim that dies takes its listener along (the rule then leads nowhere: refused).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { PortForwardStream } from '../agent-client/client.js';
import { callerPath } from '../common/caller-root.js';
import { errorMessage, internal } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { packageRoot } from '../common/paths.js';
import { run } from '../network/wiring.js';
import './task-reasons.js';

/** The socket the helper hands connections over, in the pod's state dir. */
export const PORT_FORWARD_SOCKET = 'portfwd.sock';
/** The comment that marks our rule in the pod's namespace (found and removed by it). */
export const PORT_FORWARD_RULE_COMMENT = 'kata-ts-portforward';
/** Connections relayed at once (the helper bounds its own the same way). */
const MAX_RELAYS = 64;
/** How long the helper may take to say its port, and a handed connection to say which port it wants. */
const HELLO_TIMEOUT_MS = 10_000;
/** How long the helper may take to end after its stdin closed, before SIGKILL. */
const STOP_TIMEOUT_MS = 5_000;

/** Where setup builds kata-ts-portfwd (scripts/build-native.sh): beside the compiled code. */
export function defaultPortForwardBinary(): string {
  return path.join(packageRoot(), 'dist', 'native', 'kata-ts-portfwd');
}

/**
 * The iptables arguments of the rule (pure): tcp to 127.0.0.1 leaving through `lo`, except to the
 * listener itself, redirected to the listener. `action` -A adds it, -D removes the same rule.
 */
export function planPortForwardRule(action: '-A' | '-D', listenPort: number): string[] {
  return [
    '-w',
    '-t',
    'nat',
    action,
    'OUTPUT',
    '-o',
    'lo',
    '-p',
    'tcp',
    '-d',
    '127.0.0.1/32',
    '!',
    '--dport',
    String(listenPort),
    '-m',
    'comment',
    '--comment',
    PORT_FORWARD_RULE_COMMENT,
    '-j',
    'REDIRECT',
    '--to-ports',
    String(listenPort),
  ];
}

/** The helper's first stdout line as a port, or null when it is not one (pure). */
export function parseListenPort(line: string): number | null {
  if (!/^[0-9]{1,5}$/.test(line)) return null;
  const port = Number(line);
  return port >= 1 && port <= 65535 ? port : null;
}

/** Opens the agent's PortForward stream to `port` on the guest's loopback (throws without an agent). */
export type GuestPortDialer = (port: number) => PortForwardStream;

export interface PortForwardDoorOptions {
  /** The pod's network namespace, as containerd named it (opened through its root). */
  netnsPath: string;
  stateDir: string;
  dial: GuestPortDialer;
  logger: Logger;
  /** kata-ts-portfwd; defaultPortForwardBinary() when absent. */
  binary?: string;
}

/** The door of one sandbox; `close` removes the rule, the helper and the socket (idempotent). */
export interface PortForwardDoor {
  listenPort: number;
  socketPath: string;
  helperPid: number;
  close(): Promise<void>;
}

function iptablesIn(netnsPath: string, args: string[]): string[] {
  return ['nsenter', `--net=${callerPath(netnsPath)}`, '--', 'iptables', ...args];
}

/**
 * The delete arguments of every rule of ours in `iptables -S OUTPUT` output (pure): lines carrying
 * our comment, `-A` turned into `-D`. Lines of anyone else are never touched.
 */
export function planStaleRuleRemoval(listing: string): string[][] {
  const out: string[][] = [];
  for (const line of listing.split('\n')) {
    const words = line.trim().split(/\s+/);
    if (words[0] !== '-A' || words[1] !== 'OUTPUT') continue;
    const at = words.indexOf('--comment');
    if (at < 0 || words[at + 1] !== PORT_FORWARD_RULE_COMMENT) continue;
    out.push(['-w', '-t', 'nat', '-D', ...words.slice(1)]);
  }
  return out;
}

/**
 * Remove rules of ours left in the pod's namespace (a shim that died cannot remove its own; its
 * helper ended with it, so such a rule leads nowhere). Returns how many were removed.
 */
export async function removeStalePortForwardRules(netnsPath: string): Promise<number> {
  const listing = await run(iptablesIn(netnsPath, ['-w', '-t', 'nat', '-S', 'OUTPUT']), 'NETNS_FAILED');
  const removals = planStaleRuleRemoval(listing);
  for (const args of removals) await run(iptablesIn(netnsPath, args), 'NETNS_FAILED');
  return removals.length;
}

/** Make the door; on any failure what was made is removed again and the error thrown. */
export async function openPortForwardDoor(options: PortForwardDoorOptions): Promise<PortForwardDoor> {
  const socketPath = path.join(options.stateDir, PORT_FORWARD_SOCKET);
  await removeStalePortForwardRules(options.netnsPath);
  const undo: (() => Promise<void>)[] = [];
  const rollback = async () => {
    for (const step of undo.reverse()) await step().catch(() => undefined);
  };
  try {
    const server = await listenRelay(socketPath, options);
    undo.push(async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await fsp.rm(socketPath, { force: true });
    });
    const helper = spawn(
      'nsenter',
      [`--net=${callerPath(options.netnsPath)}`, '--', options.binary ?? defaultPortForwardBinary(), '--socket', socketPath],
      {
        stdio: ['pipe', 'pipe', 'pipe'],
      },
    );
    undo.push(() => stopHelper(helper));
    const listenPort = await helperPort(helper);
    await run(iptablesIn(options.netnsPath, planPortForwardRule('-A', listenPort)), 'NETNS_FAILED');
    undo.push(async () => {
      await run(iptablesIn(options.netnsPath, planPortForwardRule('-D', listenPort)), 'NETNS_FAILED');
    });
    let closed: Promise<void> | undefined;
    options.logger.info({ listenPort, helperPid: helper.pid }, 'port-forward door open in the pod network namespace');
    return {
      listenPort,
      socketPath,
      helperPid: helper.pid ?? 0,
      close: () => {
        closed ??= rollback();
        return closed;
      },
    };
  } catch (err) {
    await rollback();
    throw err;
  }
}

function helperPort(helper: ChildProcess): Promise<number> {
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => done(new Error('it did not say its port in time')), HELLO_TIMEOUT_MS);
    const done = (failure: Error | null, port?: number) => {
      clearTimeout(timer);
      helper.stdout?.removeAllListeners('data');
      helper.removeListener('exit', onExit);
      if (failure === null) resolve(port as number);
      else reject(internal('PORT_FORWARD_DOOR_FAILED', `kata-ts-portfwd could not start: ${failure.message}`, { cause: failure }));
    };
    const onExit = (code: number | null) => done(new Error(`it exited (${code}): ${err.trim()}`));
    helper.stderr?.on('data', (chunk: Buffer) => {
      if (err.length < 4096) err += chunk.toString();
    });
    helper.once('exit', onExit);
    helper.once('error', (e) => done(e));
    helper.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const nl = out.indexOf('\n');
      if (nl < 0) {
        if (out.length > 16) done(new Error('its first line is not a port'));
        return;
      }
      const port = parseListenPort(out.slice(0, nl));
      if (port === null) done(new Error(`its first line ${JSON.stringify(out.slice(0, nl))} is not a port`));
      else done(null, port);
    });
  });
}

async function stopHelper(helper: ChildProcess): Promise<void> {
  if (helper.exitCode !== null || helper.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => helper.once('exit', () => resolve()));
  // End of file on its stdin is how it is told to go (and how it learns the shim died).
  helper.stdin?.end();
  const timer = setTimeout(() => helper.kill('SIGKILL'), STOP_TIMEOUT_MS);
  await exited;
  clearTimeout(timer);
}

async function listenRelay(socketPath: string, options: PortForwardDoorOptions): Promise<net.Server> {
  // A socket left by a shim that died is ours to replace (the pod's state dir is this shim's).
  await fsp.rm(socketPath, { force: true });
  let relays = 0;
  const server = net.createServer((socket) => {
    socket.on('error', () => undefined);
    if (relays >= MAX_RELAYS) {
      socket.destroy();
      return;
    }
    relays++;
    socket.once('close', () => relays--);
    void relayConnection(socket, options).catch((err: unknown) => {
      options.logger.info({ err: errorMessage(err) }, 'port-forward connection failed');
      socket.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve());
  });
  await fsp.chmod(socketPath, 0o600);
  return server;
}

/** The two bytes (big endian) the helper sends first: the port the client dialled. */
async function readPort(socket: net.Socket): Promise<number> {
  return new Promise((resolve, reject) => {
    let got = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error('no port was named in time')), HELLO_TIMEOUT_MS);
    const finish = (err: Error | null, port?: number) => {
      clearTimeout(timer);
      socket.removeListener('readable', onReadable);
      socket.removeListener('end', onEnd);
      if (err === null) resolve(port as number);
      else reject(err);
    };
    const onEnd = () => finish(new Error('the connection ended before naming a port'));
    const onReadable = () => {
      const need = 2 - got.length;
      const chunk = socket.read(need) as Buffer | null;
      if (chunk === null) return;
      got = Buffer.concat([got, chunk]);
      if (got.length < 2) return;
      const port = got.readUInt16BE(0);
      if (port === 0) finish(new Error('port 0 is not a TCP port'));
      else finish(null, port);
    };
    socket.on('readable', onReadable);
    socket.once('end', onEnd);
  });
}

async function relayConnection(socket: net.Socket, options: PortForwardDoorOptions): Promise<void> {
  const port = await readPort(socket);
  const conn = options.dial(port);
  socket.once('close', () => conn.cancel());
  // Client -> guest at once (an HTTP client speaks first), with the agent's backpressure.
  const upstream = (async () => {
    for await (const chunk of socket) await conn.write(chunk as Buffer);
    conn.end();
  })();
  upstream.catch(() => conn.cancel());
  let said = false;
  const say = (status: number) => {
    if (!said) socket.write(Buffer.from([status]));
    said = true;
  };
  try {
    for await (const data of conn.data) {
      say(0);
      if (socket.destroyed) return;
      if (!socket.write(data)) await new Promise<void>((resolve) => socket.once('drain', resolve).once('close', resolve));
    }
    say(0);
    socket.end();
  } catch (err) {
    if (!said) {
      // The guest refused (or the agent failed) before a byte: the client hears a reset.
      options.logger.info({ port, err: errorMessage(err) }, 'port-forward: the guest did not accept the connection');
      socket.end(Buffer.from([1]));
      return;
    }
    socket.destroy();
  }
}
