/**
 * kata-ts-shim-relay (native/shim-relay.c, docs/shim.md#the-relay): the per-pod process containerd
 * stays connected to while the node shim server behind it may die and come back.
 *
 * The real relay binary runs in front of a real upstream: our TtrpcServer (src/ttrpc) in its own
 * node process (a script this test writes, so it can be killed by pid and started again), and
 * our TtrpcClient stands for containerd. Raw sockets play the hostile downstream. No VM is needed:
 * the relay knows nothing of pods, only frames.
 *
 * Every process a test starts is recorded by pid (the servers write their own pid files, also the
 * ones the relay's revive command starts) and killed afterwards, and its directory removed, also
 * when the test fails.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import {
  closeSync,
  constants,
  existsSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { isHolderOf, outputHolder } from '../../../src/shim/node-output-holder.js';
import { encodeFrame, FrameReader, MessageType } from '../../../src/ttrpc/frames.js';
import { connectTtrpc, type TtrpcClient, TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { decodeRequest, decodeResponse, encodeRequest, encodeResponse } from '../../../src/ttrpc/messages.js';
import { until } from '../../helpers/poll.js';
import { isRunning } from '../../helpers/processes.js';
import { scaledMs } from '../../helpers/time-scale.js';

const ROOT = packageRoot();
const RELAY = path.join(ROOT, 'dist', 'native', 'kata-ts-shim-relay');
const TSX_LOADER = pathToFileURL(path.join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const SERVICE = 'test.Relay';
const MiB = 1024 * 1024;
const CALL_MS = scaledMs(60_000);

/**
 * The upstream: a ttrpc server on argv[2], named argv[3] (its generation), logging every request
 * it gets to <argv[4]>/requests.log and its pid to <argv[4]>/server-<name>.pid once it listens.
 * Echo answers at once; Wait (containerd's long call) answers once <dir>/release exists.
 */
const UPSTREAM_SCRIPT = `
import { appendFileSync, existsSync, rmSync, writeFileSync } from 'node:fs';
import { TtrpcServer } from ${JSON.stringify(path.join(ROOT, 'src', 'ttrpc', 'index.ts'))};
const [socketPath, name, dir] = process.argv.slice(2);
const log = (method, req) => appendFileSync(dir + '/requests.log', name + ' ' + method + ' ' + (req.length > 64 ? req.length + ' bytes' : req.toString()) + '\\n');
const server = new TtrpcServer();
server.register(${JSON.stringify(SERVICE)}, {
  Echo: (req) => { log('Echo', req); return Buffer.concat([Buffer.from(name + ':'), req]); },
  Wait: async (req, call) => {
    log('Wait', req);
    while (!existsSync(dir + '/release')) {
      if (call.signal.aborted) throw call.signal.reason;
      await new Promise((r) => setTimeout(r, 50));
    }
    return Buffer.from(name + ':waited:' + req.toString());
  },
});
// A killed predecessor leaves its socket file behind.
rmSync(socketPath, { force: true });
await server.listen(socketPath);
writeFileSync(dir + '/server-' + name + '.pid', String(process.pid));
`;

interface Relay {
  child: ChildProcess;
  pid: number;
  stderr: () => string;
  exited: Promise<number | null>;
}

let dir = '';
const pids = new Set<number>();
const clients: TtrpcClient[] = [];
const sockets: net.Socket[] = [];

function killAll(): void {
  // Servers the relay's revive started are not our children: their pid files name them.
  if (dir !== '' && existsSync(dir)) {
    for (const name of readdirSync(dir)) {
      const m = /^server-.*\.pid$/.exec(name);
      if (m) {
        const pid = Number(readFileSync(path.join(dir, name), 'utf8'));
        if (pid > 0) pids.add(pid);
      }
    }
    // A revive script that execs a server logs that server's pid there: a relay that revived
    // twice (wrongly) leaves two servers, and only the last one's pid file.
    const reviveLog = path.join(dir, 'revive.log');
    if (existsSync(reviveLog)) {
      for (const line of readFileSync(reviveLog, 'utf8').split('\n')) {
        const pid = Number(line.split(' ')[1]);
        if (pid > 0) pids.add(pid);
      }
    }
  }
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  pids.clear();
}

afterEach(async () => {
  for (const c of clients.splice(0)) await c.close().catch(() => undefined);
  for (const s of sockets.splice(0)) s.destroy();
  killAll();
  serverExits.clear();
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
  dir = '';
});

function freshDir(): string {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ktrelay-'));
  writeFileSync(path.join(dir, 'upstream.mts'), UPSTREAM_SCRIPT);
  return dir;
}

const podSocket = (): string => path.join(dir, 'pod.sock');
const upstreamSocket = (): string => path.join(dir, 'upstream.sock');
const serverArgv = (name: string): string[] => [
  process.execPath,
  '--import',
  TSX_LOADER,
  path.join(dir, 'upstream.mts'),
  upstreamSocket(),
  name,
  dir,
];

/** Our server children's exits: a SIGKILLed node is gone (its sockets closed) once it is reaped. */
const serverExits = new Map<number, Promise<void>>();

/** Starts an upstream server named `name` and waits until it listens; returns its pid. */
async function startServer(name: string): Promise<number> {
  const [cmd, ...args] = serverArgv(name);
  const child = spawn(cmd as string, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  if (child.pid === undefined) throw new Error('the upstream server did not start');
  pids.add(child.pid);
  serverExits.set(child.pid, new Promise((resolve) => child.once('exit', () => resolve())));
  await until(`upstream server ${name} to listen`, async (note) => {
    note(child.exitCode === null ? 'starting' : `exited ${child.exitCode}`);
    if (child.exitCode !== null) throw new Error(`upstream server ${name} exited ${child.exitCode}`);
    return existsSync(path.join(dir, `server-${name}.pid`)) ? true : undefined;
  });
  return child.pid;
}

/**
 * Kills a server and waits for its reaping: the thread group leader of a killed node shows as a
 * zombie while its other threads still hold the listening socket open.
 */
async function killServer(pid: number): Promise<void> {
  process.kill(pid, 'SIGKILL');
  await serverExits.get(pid);
}

/** Starts the relay (`nofile`: its descriptor limit, set by a shell that then execs it, same pid). */
function startRelay(revive: string[] = [], listen = podSocket(), nofile?: number): Relay {
  const args = ['--listen', listen, '--upstream', upstreamSocket(), '--pid-file', path.join(dir, 'relay.pid')];
  if (revive.length > 0) args.push('--', ...revive);
  const child =
    nofile === undefined
      ? spawn(RELAY, args, { stdio: ['ignore', 'ignore', 'pipe'] })
      : spawn('sh', ['-c', `ulimit -n ${nofile} && exec "$0" "$@"`, RELAY, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  if (child.pid === undefined) throw new Error('the relay did not start');
  pids.add(child.pid);
  let err = '';
  child.stderr?.on('data', (b: Buffer) => {
    err += b.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, pid: child.pid, stderr: () => err, exited };
}

async function relayListening(relay: Relay): Promise<void> {
  await until('the relay to listen', async (note) => {
    note(relay.stderr());
    if (existsSync(path.join(dir, 'relay.pid'))) return true;
    if (relay.child.exitCode !== null) throw new Error(`the relay exited ${relay.child.exitCode}: ${relay.stderr()}`);
    return undefined;
  });
}

async function client(): Promise<TtrpcClient> {
  const c = await connectTtrpc(podSocket());
  clients.push(c);
  return c;
}

/** A call with a bound (generous, scaled), so a relay that loses it fails the test rather than hanging it. */
const call = (c: TtrpcClient, method: string, text: string | Buffer): Promise<string> =>
  c.call(SERVICE, method, typeof text === 'string' ? Buffer.from(text) : text, { timeoutMs: CALL_MS }).then((b) => b.toString());

const requestsLog = (): string[] =>
  existsSync(path.join(dir, 'requests.log')) ? readFileSync(path.join(dir, 'requests.log'), 'utf8').split('\n').filter(Boolean) : [];

/** A raw connection to the pod socket, for bytes no client would send. */
async function rawSocket(): Promise<net.Socket> {
  const s = net.connect(podSocket());
  sockets.push(s);
  s.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    s.once('connect', () => resolve());
    s.once('error', reject);
  });
  return s;
}

function closedPromise(s: net.Socket): Promise<void> {
  return new Promise((resolve) => {
    if (s.destroyed || s.readableEnded) resolve();
    else s.once('close', () => resolve());
  });
}

function header(dataBytes: number, streamId: number, type: number): Buffer {
  const h = Buffer.alloc(10);
  h.writeUInt32BE(dataBytes >>> 0, 0);
  h.writeUInt32BE(streamId >>> 0, 4);
  h.writeUInt8(type, 8);
  return h;
}

/**
 * How long `pid` was runnable (on a CPU or waiting for one: /proc/<pid>/schedstat) in the next 2 s,
 * in ms. A busy loop is runnable all along however loaded the machine is (about 2000), an idle
 * relay blocked in ppoll almost never.
 */
async function runnableMsOver2s(pid: number): Promise<number> {
  const runnableNs = (): number => {
    const [onCpu, waiting] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(' ').map(Number);
    return (onCpu ?? Number.NaN) + (waiting ?? Number.NaN);
  };
  const before = runnableNs();
  await new Promise((r) => setTimeout(r, 2000));
  return Math.round((runnableNs() - before) / 1e6);
}

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? Number.NaN);
}

describe('kata-ts-shim-relay', () => {
  beforeAll(() => {
    // The binary under test is the current source (the script rebuilds only what changed).
    execFileSync('bash', [path.join(ROOT, 'scripts', 'build-native.sh')], { stdio: 'inherit' });
  });

  it('passes calls through whole: answers match their calls, statuses too, large and concurrent, on many connections', async () => {
    freshDir();
    await startServer('one');
    const relay = startRelay();
    await relayListening(relay);
    // The socket is the owner's alone, and the pid file names the relay.
    expect(statSync(podSocket()).mode & 0o777).toBe(0o600);
    expect(readFileSync(path.join(dir, 'relay.pid'), 'utf8').trim()).toBe(String(relay.pid));

    const c = await client();
    expect(await call(c, 'Echo', 'hello')).toBe('one:hello');
    // 3 MiB: many reads and writes on either side of the relay, one frame.
    const big = Buffer.alloc(3 * MiB, 'x');
    const answer = await c.call(SERVICE, 'Echo', big, { timeoutMs: CALL_MS });
    expect(answer.length).toBe(big.length + 4);
    expect(answer.subarray(4).equals(big)).toBe(true);
    // Many calls in flight on one connection, each answered on its own stream.
    const many = await Promise.all(Array.from({ length: 50 }, (_, i) => call(c, 'Echo', `n${i}`)));
    expect(many).toEqual(Array.from({ length: 50 }, (_, i) => `one:n${i}`));
    // A status other than OK passes through as it is.
    const err = await c.call(SERVICE, 'Nope', Buffer.alloc(0), { timeoutMs: CALL_MS }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TtrpcStatusError);
    expect((err as TtrpcStatusError).code).toBe(12); // UNIMPLEMENTED
    // Many connections at once, each with its own calls.
    const conns = await Promise.all(Array.from({ length: 40 }, () => client()));
    const answers = await Promise.all(conns.map((k, i) => call(k, 'Echo', `c${i}`)));
    expect(answers).toEqual(conns.map((_, i) => `one:c${i}`));
    expect(isRunning(relay.pid)).toBe(true);
  });

  it('keeps the downstream connection when the upstream dies: the call in flight is replayed to the next server and answered on the same connection', async () => {
    freshDir();
    const first = await startServer('one');
    const relay = startRelay();
    await relayListening(relay);
    const c = await client();
    expect(await call(c, 'Echo', 'before')).toBe('one:before');
    const waiting = call(c, 'Wait', 'task-1');
    await until('the first server to get Wait', async (note) => {
      note(requestsLog());
      return requestsLog().includes('one Wait task-1') ? true : undefined;
    });
    await killServer(first);
    // Sent while nothing serves the pod: queued, and sent after the replayed Wait.
    const during = call(c, 'Echo', 'during');
    await startServer('two');
    await until('the second server to get the replayed Wait and the queued Echo', async (note) => {
      note(requestsLog());
      const log = requestsLog();
      return log.includes('two Wait task-1') && log.includes('two Echo during') ? true : undefined;
    });
    const log = requestsLog();
    expect(log.indexOf('two Wait task-1')).toBeLessThan(log.indexOf('two Echo during'));
    expect(await during).toBe('two:during');
    writeFileSync(path.join(dir, 'release'), '');
    expect(await waiting).toBe('two:waited:task-1');
    // The same client connection goes on.
    expect(await call(c, 'Echo', 'after')).toBe('two:after');
    expect(c.pendingCalls).toBe(0);
    // Wait, and Echo 'during' too when it reached the relay before the relay saw the loss.
    expect(relay.stderr()).toMatch(/upstream connection lost \(.*\); [12] request\(s\) unanswered/);
    expect(relay.stderr()).toMatch(/upstream back; sending [12] unanswered request\(s\) again/);
  });

  it('revives a refusing upstream once it has refused for 1 s: the revive command starts the server and the call completes', async () => {
    freshDir();
    const script = path.join(dir, 'revive.sh');
    const [cmd, ...args] = serverArgv('revived');
    writeFileSync(
      script,
      `#!/bin/sh\necho "$(date +%s.%N) $$" >> ${dir}/revive.log\nexec ${[cmd, ...args].map((a) => `'${a}'`).join(' ')}\n`,
      { mode: 0o755 },
    );
    const relay = startRelay([script]);
    await relayListening(relay);
    const c = await client();
    // Nothing serves the upstream socket: the relay retries, then runs the revive command.
    expect(await call(c, 'Echo', 'wake')).toBe('revived:wake');
    const runs = readFileSync(path.join(dir, 'revive.log'), 'utf8').split('\n').filter(Boolean);
    expect(runs).toHaveLength(1);
    expect(relay.stderr()).toMatch(/refused connections for \d+ ms; started/);
    const refusedMs = Number(/refused connections for (\d+) ms/.exec(relay.stderr())?.[1]);
    expect(refusedMs).toBeGreaterThanOrEqual(1000);
  });

  it('runs the revive command at most once per 10 s while the upstream stays down', async () => {
    freshDir();
    const script = path.join(dir, 'revive.sh');
    writeFileSync(script, `#!/bin/sh\necho "$(date +%s.%N)" >> ${dir}/revive.log\n`, { mode: 0o755 });
    const relay = startRelay([script]);
    await relayListening(relay);
    const c = await client();
    const pending = call(c, 'Echo', 'never').catch((e: unknown) => e);
    const runs = (): number[] =>
      existsSync(path.join(dir, 'revive.log'))
        ? readFileSync(path.join(dir, 'revive.log'), 'utf8').split('\n').filter(Boolean).map(Number)
        : [];
    await until('the revive command to run twice', async (note) => {
      note(runs());
      return runs().length >= 2 ? true : undefined;
    });
    const [a, b] = runs() as [number, number];
    expect(b - a).toBeGreaterThanOrEqual(9.9);
    // The call still waits (queued), and the relay is still there for it.
    expect(c.pendingCalls).toBe(1);
    expect(isRunning(relay.pid)).toBe(true);
    await c.close();
    await pending;
  });

  it('survives hostile downstreams: an oversized header, garbage cut mid-frame, random bytes, a flood while the upstream is down; stays small, others go on', async () => {
    freshDir();
    const server = await startServer('one');
    const relay = startRelay();
    await relayListening(relay);
    const good = await client();
    expect(await call(good, 'Echo', 'first')).toBe('one:first');
    const idleRss = rssKiB(relay.pid);

    // A header announcing 0xFFFFFFFF bytes: that downstream is closed, nothing is allocated.
    const huge = await rawSocket();
    const hugeClosed = closedPromise(huge);
    huge.write(header(0xffffffff, 1, 1));
    await hugeClosed;
    expect(relay.stderr()).toContain('a frame over 4194304 bytes from the downstream');
    expect(await call(good, 'Echo', 'after-huge')).toBe('one:after-huge');

    // Garbage, then half a frame, then the client goes away.
    const garbage = await rawSocket();
    garbage.write(Buffer.from([0, 0, 0, 20, 0, 0, 0, 1, 1, 0, 9, 9, 9]));
    garbage.end(header(1000, 3, 1).subarray(0, 6));
    await closedPromise(garbage);
    expect(await call(good, 'Echo', 'after-garbage')).toBe('one:after-garbage');

    // Seeded random bytes on 30 connections (some start as a plausible header, so both the
    // header checks and frames cut short are met), each closed after its bytes.
    let seed = 0x5eed;
    const random = (): number => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return seed >>> 8;
    };
    for (let i = 0; i < 30; i++) {
      const fuzz = await rawSocket();
      const bytes = Buffer.alloc(1 + (random() % 4096));
      for (let j = 0; j < bytes.length; j++) bytes[j] = random() & 0xff;
      if (i % 2 === 0) header(random() % 8192, random(), 1 + (random() % 3)).copy(bytes);
      fuzz.end(bytes);
    }
    expect(await call(good, 'Echo', 'after-fuzz')).toBe('one:after-fuzz');
    expect(isRunning(relay.pid)).toBe(true);

    // The upstream goes; a flood of whole 1 MiB requests past the 16 MiB bound closes the flooder.
    await killServer(server);
    const flooder = await rawSocket();
    const floodClosed = closedPromise(flooder);
    const frame = Buffer.concat([header(MiB, 0, 1), Buffer.alloc(MiB, 0x5a)]);
    let sent = 0;
    let id = 1;
    flooder.on('close', () => undefined);
    while (!flooder.destroyed && sent < 40 * MiB) {
      frame.writeUInt32BE(id, 4);
      id += 2;
      const ok = flooder.write(Buffer.from(frame));
      sent += frame.length;
      if (!ok) await Promise.race([new Promise((r) => flooder.once('drain', r)), floodClosed]);
    }
    await floodClosed;
    // (The relay writes why before it closes; its stderr may reach us after the close.)
    await until('the relay to say why it closed the flooder', async (note) => {
      note(relay.stderr());
      return relay.stderr().includes('over 16 MiB queued or unanswered for the downstream') ? true : undefined;
    });
    expect(isRunning(relay.pid)).toBe(true);
    // What the flood made the relay hold is given back: its resident size comes back near idle.
    const peakKiB = Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${relay.pid}/status`, 'utf8'))?.[1]);
    expect(peakKiB).toBeGreaterThan(idleRss + 8 * 1024);
    const afterRss = await until('the relay to give back what the flood made it hold', async (note) => {
      const kib = rssKiB(relay.pid);
      note(`${kib} KiB resident, ${idleRss} KiB idle`);
      return kib < idleRss + 2048 ? kib : undefined;
    });

    // The good connection waited through all of it and goes on once a server is back.
    const queued = call(good, 'Echo', 'after-flood');
    await startServer('two');
    expect(await queued).toBe('two:after-flood');
    const other = await client();
    expect(await call(other, 'Echo', 'new')).toBe('two:new');
    console.log(`relay RSS: ${idleRss} KiB idle, ${peakKiB} KiB at most during the flood, ${afterRss} KiB after it`);
  });

  it('takes nothing on trust from the upstream either: an answer to no request is dropped, one over 4 MiB is skipped and answered RESOURCE_EXHAUSTED', async () => {
    freshDir();
    // A raw upstream in this process: what it sends back depends on the method called.
    const servers: net.Socket[] = [];
    const upstream = net.createServer((sock) => {
      servers.push(sock);
      sock.on('error', () => undefined);
      const reader = new FrameReader();
      sock.on('data', (chunk: Buffer) => {
        for (const event of reader.push(chunk)) {
          if (event.kind !== 'frame') continue;
          const { streamId, data } = event.frame;
          const request = decodeRequest(data);
          const ok = (text: string) => encodeResponse({ status: { code: 0, message: '' }, payload: Buffer.from(text) });
          if (request.method === 'Oversize') {
            // Over ttrpc's cap, announced and sent: the relay must pass these bytes by unheld.
            const body = Buffer.alloc(4 * MiB + 1, 0x41);
            sock.write(Buffer.concat([header(body.length, streamId, MessageType.RESPONSE), body]));
          } else {
            // First an answer to a stream nobody asked on, then the real one.
            sock.write(encodeFrame(streamId + 1000, MessageType.RESPONSE, 0, ok('stray')));
            sock.write(encodeFrame(streamId, MessageType.RESPONSE, 0, ok(`raw:${request.payload.toString()}`)));
          }
        }
      });
    });
    await new Promise<void>((resolve) => upstream.listen(upstreamSocket(), () => resolve()));
    try {
      const relay = startRelay();
      await relayListening(relay);
      const c = await client();
      expect(await call(c, 'Echo', 'one')).toBe('raw:one');
      const err = await c.call(SERVICE, 'Oversize', Buffer.alloc(0), { timeoutMs: CALL_MS }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TtrpcStatusError);
      expect((err as TtrpcStatusError).code).toBe(8); // RESOURCE_EXHAUSTED
      expect((err as TtrpcStatusError).message).toContain('exceeds 4194304 bytes');
      // The connection goes on, in step: the next answer is the next call's.
      expect(await call(c, 'Echo', 'two')).toBe('raw:two');
      expect(c.pendingCalls).toBe(0);
      // On the wire: the stray answer (sent first, on stream 1001) never reaches the downstream.
      const raw = await rawSocket();
      const frames: { streamId: number; payload: string }[] = [];
      const reader = new FrameReader();
      raw.on('data', (chunk: Buffer) => {
        for (const event of reader.push(chunk)) {
          if (event.kind === 'frame')
            frames.push({ streamId: event.frame.streamId, payload: decodeResponse(event.frame.data).payload.toString() });
        }
      });
      const request = encodeRequest({ service: SERVICE, method: 'Echo', payload: Buffer.from('wire'), timeoutNs: 0, metadata: [] });
      raw.write(encodeFrame(1, MessageType.REQUEST, 0, request));
      await until('the answer on the raw connection', async (note) => {
        note(frames);
        return frames.length > 0 ? true : undefined;
      });
      // A second request, so a stray frame still on its way would show before this answer.
      raw.write(encodeFrame(3, MessageType.REQUEST, 0, request));
      await until('the second answer on the raw connection', async (note) => {
        note(frames);
        return frames.length > 1 ? true : undefined;
      });
      expect(frames).toEqual([
        { streamId: 1, payload: 'raw:wire' },
        { streamId: 3, payload: 'raw:wire' },
      ]);
      expect(isRunning(relay.pid)).toBe(true);
      // The skipped 4 MiB were never held.
      expect(rssKiB(relay.pid)).toBeLessThan(4 * 1024);
    } finally {
      for (const sock of servers) sock.destroy();
      await new Promise<void>((resolve) => upstream.close(() => resolve()));
    }
  });

  it('does not spin when a downstream stops reading and its upstream goes, and caps connections at 128', async () => {
    freshDir();
    // An upstream answering every request with 512 KiB, and closing each connection after 0.5 s.
    const upstream = net.createServer((sock) => {
      sock.on('error', () => undefined);
      const reader = new FrameReader();
      sock.on('data', (chunk: Buffer) => {
        for (const event of reader.push(chunk)) {
          if (event.kind === 'frame') sock.write(encodeFrame(event.frame.streamId, MessageType.RESPONSE, 0, Buffer.alloc(512 * 1024)));
        }
      });
      setTimeout(() => sock.destroy(), 500);
    });
    await new Promise<void>((resolve) => upstream.listen(upstreamSocket(), () => resolve()));
    try {
      const relay = startRelay();
      await relayListening(relay);
      // 4 MiB of answers for a downstream that reads none: the relay holds 1 MiB of them and stops
      // reading the upstream, which then hangs up.
      const stuck = await rawSocket();
      stuck.pause();
      for (let i = 0; i < 8; i++) stuck.write(encodeFrame(1 + 2 * i, MessageType.REQUEST, 0, Buffer.from('x')));
      await until('the upstream to hang up on the relay', async (note) => {
        const conns = await new Promise<number>((resolve) => upstream.getConnections((_, n) => resolve(n)));
        note(`${conns} upstream connections`);
        return conns === 0 ? true : undefined;
      });
      expect(await runnableMsOver2s(relay.pid)).toBeLessThan(500);
      expect(isRunning(relay.pid)).toBe(true);

      // Connections past 128 are closed on accept; the ones before them stay served.
      const held: net.Socket[] = [];
      // One after another: a burst would meet the listen backlog (EAGAIN), not the cap.
      for (let i = 0; i < 140; i++) held.push(await rawSocket());
      const closedCount = (): number => held.filter((s) => s.destroyed || s.readableEnded).length;
      await until('the connections past 128 to be closed', async (note) => {
        note(`${closedCount()} closed`);
        // 128 at once, `stuck` among them.
        return closedCount() === 140 - 127 ? true : undefined;
      });
      expect(relay.stderr()).toContain('refusing connections: 128 are open already');
      for (const s of held) s.destroy();
      stuck.destroy();
      // Room again: a new connection's request is answered (the upstream's 512 KiB answer).
      const answered = await until('a new connection to be answered once the others closed', async (note) => {
        const raw = await rawSocket();
        const reader = new FrameReader();
        const got = await new Promise<number | undefined>((resolve) => {
          const timer = setTimeout(() => resolve(undefined), 1000);
          raw.on('data', (chunk: Buffer) => {
            for (const event of reader.push(chunk)) {
              if (event.kind === 'frame') {
                clearTimeout(timer);
                resolve(event.frame.data.length);
              }
            }
          });
          raw.once('close', () => resolve(undefined));
          raw.write(encodeFrame(1, MessageType.REQUEST, 0, Buffer.from('x')));
        });
        raw.destroy();
        note(got === undefined ? 'no answer yet' : `${got} bytes`);
        return got;
      });
      expect(answered).toBe(512 * 1024);
    } finally {
      await new Promise<void>((resolve) => upstream.close(() => resolve()));
    }
  });

  it('out of descriptors, waits for them instead of spinning, and serves again once connections close', async () => {
    freshDir();
    // 16 descriptors: 3 of stdio, the listener, and room for a few connections only.
    const relay = startRelay([], podSocket(), 16);
    await relayListening(relay);
    const held: net.Socket[] = [];
    // Past what it can accept: the rest wait in the listen backlog, connected but not accepted.
    for (let i = 0; i < 24; i++) held.push(await rawSocket());
    expect(await runnableMsOver2s(relay.pid)).toBeLessThan(500);
    expect(isRunning(relay.pid)).toBe(true);
    for (const s of held) s.destroy();
    await startServer('one');
    const c = await until('a connection to be served once descriptors are free', async (note) => {
      try {
        const k = await client();
        note('connected');
        return await call(k, 'Echo', 'room').then(() => k);
      } catch (err) {
        note(String(err));
        return undefined;
      }
    });
    expect(await call(c, 'Echo', 'again')).toBe('one:again');
  });

  it('exits 0 once <upstream>.gone exists and nothing is unanswered, and not before', async () => {
    freshDir();
    const server = await startServer('one');
    const relay = startRelay();
    await relayListening(relay);
    const c = await client();
    const waiting = call(c, 'Wait', 'last');
    await until('the server to get Wait', async () => (requestsLog().includes('one Wait last') ? true : undefined));
    // The pod is shut down for good, but containerd still waits for an answer: the relay stays.
    writeFileSync(`${upstreamSocket()}.gone`, '');
    await killServer(server);
    const stillThere = await Promise.race([relay.exited.then(() => false), new Promise((r) => setTimeout(() => r(true), 2500))]);
    expect(stillThere).toBe(true);
    expect(isRunning(relay.pid)).toBe(true);
    // Answered (a server came back for it): nothing is unanswered, the relay goes by itself.
    writeFileSync(path.join(dir, 'release'), '');
    await startServer('two');
    expect(await waiting).toBe('two:waited:last');
    expect(await relay.exited).toBe(0);
    expect(existsSync(podSocket())).toBe(false);

    // And with nothing in flight at all, it goes as soon as it looks.
    rmSync(path.join(dir, 'relay.pid'));
    const idle = startRelay();
    await relayListening(idle);
    expect(await idle.exited).toBe(0);
  });

  it('replaces a stale pod socket, refuses one something answers on and a file that is not a socket', async () => {
    freshDir();
    await startServer('one');
    const first = startRelay();
    await relayListening(first);
    // Another relay for the same pod socket: the live one is left alone.
    const second = startRelay([], podSocket());
    expect(await second.exited).toBe(125);
    expect(second.stderr()).toContain(`--listen ${podSocket()} is a socket something answers on; refusing to replace it`);
    expect(await call(await client(), 'Echo', 'still')).toBe('one:still');

    // Killed outright, the first leaves its socket file: nothing answers there, so it is replaced.
    first.child.kill('SIGKILL');
    await first.exited;
    expect(statSync(podSocket()).isSocket()).toBe(true);
    rmSync(path.join(dir, 'relay.pid'));
    const third = startRelay();
    await relayListening(third);
    expect(await call(await client(), 'Echo', 'replaced')).toBe('one:replaced');
    // SIGTERM: everything closed, exit 0.
    third.child.kill('SIGTERM');
    expect(await third.exited).toBe(0);

    const plain = path.join(dir, 'plain');
    writeFileSync(plain, 'not a socket');
    const fourth = startRelay([], plain);
    expect(await fourth.exited).toBe(125);
    expect(fourth.stderr()).toContain(`--listen ${plain} exists and is not a socket; refusing to replace it`);
    expect(readFileSync(plain, 'utf8')).toBe('not a socket');
  });
});

/**
 * `--hold` (src/shim/node-output-holder.ts): containerd stops copying a container's FIFO once
 * every writer has closed it. In node mode the writer is the node server; a SIGKILL of it must not
 * end the container's log. Here the test process reads the FIFOs as containerd's copy does, a
 * child writes them as the node server does and is killed, and a second child writes as the
 * revived server.
 */
describe('kata-ts-shim-relay --hold', () => {
  const fds: number[] = [];
  const children: ChildProcess[] = [];
  const holderPids: number[] = [];
  const logger = silentLogger();
  afterEach(() => {
    for (const c of children.splice(0)) c.kill('SIGKILL');
    for (const pid of holderPids.splice(0)) if (isRunning(pid)) process.kill(pid, 'SIGKILL');
    for (const fd of fds.splice(0)) closeSync(fd);
  });
  beforeAll(() => {
    execFileSync('bash', [path.join(ROOT, 'scripts', 'build-native.sh')], { stdio: 'inherit' });
  });
  /** containerd's side: the FIFO made and opened for reading, not blocking. */
  const readerOf = (fifo: string): number => {
    execFileSync('mkfifo', ['-m', '600', fifo]);
    const fd = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    fds.push(fd);
    return fd;
  };
  /** What the reader has now: bytes, 'eof' (every writer gone), or 'nothing yet'. */
  const readNow = (fd: number): string => {
    const buf = Buffer.alloc(4096);
    try {
      const n = readSync(fd, buf, 0, buf.length, null);
      return n === 0 ? 'eof' : buf.subarray(0, n).toString();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EAGAIN') return 'nothing yet';
      throw err;
    }
  };
  /** A writer process (the node server's pump): prints `text` into the FIFOs, then waits to be killed or exits. */
  const writer = async (stdout: string, stderr: string, text: string, stay: boolean): Promise<ChildProcess> => {
    // Opened here for the child only: a write end left open in the test would hold the FIFO itself.
    const ends = [openSync(stdout, 'w'), openSync(stderr, 'w')];
    const child = spawn('sh', ['-c', `printf '%s' "$1"; printf '%s' "$1" >&2; ${stay ? 'exec sleep 600' : 'exit 0'}`, 'writer', text], {
      stdio: ['ignore', ends[0]!, ends[1]!],
    });
    for (const fd of ends) closeSync(fd);
    children.push(child);
    await new Promise((r) => child.once('spawn', r));
    return child;
  };

  it("keeps containerd's FIFOs open across the writer's SIGKILL, so a new writer's bytes still reach the reader; released, the reader sees the end", async () => {
    freshDir();
    const out = path.join(dir, 'stdout');
    const err = path.join(dir, 'stderr');
    const [outR, errR] = [readerOf(out), readerOf(err)];
    const holder = outputHolder(RELAY, logger);
    const pid = await holder.hold('c1', { stdout: out, stderr: err });
    expect(pid).toBeDefined();
    holderPids.push(pid!);
    expect(isHolderOf(pid!, 'c1')).toBe(true);
    expect(isHolderOf(pid!, 'c2')).toBe(false);
    const first = await writer(out, err, 'before ', true);
    await until('the first bytes', async () => (readNow(outR) === 'before ' && readNow(errR) === 'before ' ? true : undefined));
    first.kill('SIGKILL');
    await new Promise((r) => first.once('exit', r));
    // Without a holder both readers would read their end here, and containerd would stop copying.
    expect([readNow(outR), readNow(errR)]).toEqual(['nothing yet', 'nothing yet']);
    const revived = await writer(out, err, 'after', false);
    await new Promise((r) => revived.once('exit', r));
    await until("the revived writer's bytes", async () => (readNow(outR) === 'after' && readNow(errR) === 'after' ? true : undefined));
    expect(readNow(outR)).toBe('nothing yet');
    await holder.release('c1', pid!);
    expect(isRunning(pid!)).toBe(false);
    expect([readNow(outR), readNow(errR)]).toEqual(['eof', 'eof']);
  });

  it('ends by itself once containerd closed its FIFOs; releases nothing but its own holder; holds nothing without a reader', async () => {
    freshDir();
    const out = path.join(dir, 'stdout');
    const outR = readerOf(out);
    const holder = outputHolder(RELAY, logger);
    const pid = await holder.hold('c1', { stdout: out, stderr: '' });
    holderPids.push(pid!);
    // Another process's pid, or another container's: not signalled.
    const other = spawn('sleep', ['600'], { stdio: 'ignore' });
    children.push(other);
    await new Promise((r) => other.once('spawn', r));
    await holder.release('c1', other.pid!);
    await holder.release('c2', pid!);
    expect([isRunning(other.pid!), isRunning(pid!)]).toEqual([true, true]);
    // containerd closes its reader (the task deleted): the holder has nobody to keep reading and exits.
    closeSync(fds.splice(fds.indexOf(outR), 1)[0]!);
    await until('the holder to exit', async () => (isRunning(pid!) ? undefined : true));
    // A FIFO nobody reads: nothing to hold, no process.
    const lonely = path.join(dir, 'lonely');
    execFileSync('mkfifo', ['-m', '600', lonely]);
    expect(await holder.hold('c3', { stdout: lonely, stderr: lonely })).toBeUndefined();
  });
});
