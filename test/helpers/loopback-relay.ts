/**
 * Makes the host's 127.0.0.1:`port` (a registry) answer on 127.0.0.1:`port` inside a network
 * namespace the test created, so that a daemon living there can pull: a relay listening in that
 * namespace (a node process started through `enter`, e.g. `nsenter --target <pid> --net --`)
 * hands each connection through a unix socket (file systems are shared, network namespaces are
 * not) to this process, which connects to the host's port. No interface or route is added
 * anywhere. The same mechanism as network-node.ts's relayLoopbackPort, for namespaces entered by
 * other means than `ip netns`.
 * vitest-free, so that benches share it.
 */
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

/** The namespace-side half: TCP on the namespace's loopback -> the unix socket. */
const RELAY_SCRIPT = `
const net = require('node:net');
const [port, sock] = process.argv.slice(1);
net.createServer((c) => {
  const u = net.connect(sock);
  c.pipe(u); u.pipe(c);
  c.on('error', () => u.destroy()); u.on('error', () => c.destroy());
  c.on('close', () => u.destroy()); u.on('close', () => c.destroy());
}).listen(Number(port), '127.0.0.1', () => process.stdout.write('ready\\n'));
`;

export interface LoopbackRelay {
  port: number;
  /** The pid of the namespace-side process (ours, killed by pid in stop). */
  pid: number;
  stop(): Promise<void>;
}

/**
 * Starts a relay for `port` into the namespace `enter` (argv prefix) enters; its unix socket is
 * made in `socketDir`. Resolves once the namespace side listens.
 */
export async function startLoopbackRelay(enter: string[], port: number, socketDir: string): Promise<LoopbackRelay> {
  const sock = path.join(socketDir, `relay-${port}.sock`);
  const server = net.createServer((c) => {
    const t = net.connect(port, '127.0.0.1');
    c.pipe(t);
    t.pipe(c);
    c.on('error', () => t.destroy());
    t.on('error', () => c.destroy());
    c.on('close', () => t.destroy());
    t.on('close', () => c.destroy());
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(sock, resolve));
  const [cmd, ...args] = enter;
  if (cmd === undefined) throw new Error('startLoopbackRelay: empty enter command');
  const child = spawn(cmd, [...args, process.execPath, '-e', RELAY_SCRIPT, String(port), sock], { stdio: ['ignore', 'pipe', 'inherit'] });
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
      const gone = new Promise((r) => child.once('exit', r));
      process.kill(child.pid, 'SIGKILL');
      await gone;
    }
    await new Promise<void>((r) => server.close(() => r()));
  };
  try {
    await new Promise<void>((resolve, reject) => {
      child.stdout.once('data', () => resolve());
      child.once('exit', (code) => reject(new Error(`the loopback relay for port ${port} exited with ${code}`)));
    });
  } catch (err) {
    await stop();
    throw err;
  }
  return { port, pid: child.pid as number, stop };
}
