/**
 * A "node" network namespace of the test's own, with a CNI config (bridge + host-local on a
 * private subnet of the test's choosing + portmap) in a temp dir, for running the daemon in
 * (createTestRuntime's netnsPath) and talking to pod IPs only from inside it. Nothing of it is in
 * the host's own namespace; cleanup() removes the namespace (its bridge, veths and iptables rules
 * go with it), the pods' namespaces the test names, and the temp dir.
 * vitest-free, so that benches share it.
 */
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { ownNetnsNames, type TestRuntime } from './runtime-daemon.js';

const execFileAsync = promisify(execFile);

/** Debian's containernetworking-plugins (installed by scripts/setup.sh). */
export const DEBIAN_CNI_BIN_DIR = '/usr/lib/cni';

export interface NetworkNode {
  name: string;
  netnsPath: string;
  dir: string;
  cniConfDir: string;
  /** host-local's dataDir: one file per allocated IP under `<ipamDir>/<network name>/`. */
  ipamDir: string;
  networkName: string;
  /** The subnet's first three octets, e.g. `10.213.7`. */
  prefix: string;
  subnet: string;
  /** The bridge's address (the pods' gateway), on the node side. */
  gateway: string;
  /** The IPv6 /64 (a ULA) host-local also hands out: every pod is dual-stack. */
  subnet6: string;
  gateway6: string;
  bridge: string;
  /** Run a command inside the node namespace. */
  exec(argv: string[], timeoutMs?: number): Promise<string>;
  /** An HTTP GET from inside the node namespace (node's fetch; busybox wget segfaults here): the body. */
  httpGet(url: string, timeoutMs?: number): Promise<string>;
  /** The daemon's `network` config section for this node. */
  networkConfig(): Record<string, unknown>;
  /** host-local's allocations (IP file names). */
  allocations(): Promise<string[]>;
  /** Interface names in the node namespace (veths, bridge). */
  links(): Promise<string[]>;
  /**
   * Make the host's 127.0.0.1:`port` (a registry, a proxy) answer on 127.0.0.1:`port` inside the
   * node too, so a daemon running in the node can pull: a relay listening in the node (a node
   * process under nsenter) hands each connection through a unix socket (file systems are shared,
   * network namespaces are not) to this process, which connects to the host's port. No interface
   * is added anywhere. Stopped by cleanup() or the returned function.
   */
  relayLoopbackPort(port: number): Promise<() => Promise<void>>;
  cleanup(podNetnsNames?: string[]): Promise<void>;
}

/** The node-side half of relayLoopbackPort: TCP on the node's loopback -> the unix socket. */
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

export async function createNetworkNode(): Promise<NetworkNode> {
  const tag = randomBytes(3).toString('hex');
  const name = `kts-node-${tag}`;
  const netnsPath = `/run/netns/${name}`;
  // 10.200.0.0/16 - 10.254.0.0/16: private, and only ever routed inside this namespace.
  const prefix = `10.${200 + (Number.parseInt(tag.slice(0, 2), 16) % 55)}.${Number.parseInt(tag.slice(2, 4), 16)}`;
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-net-'));
  const cniConfDir = path.join(dir, 'net.d');
  const ipamDir = path.join(dir, 'ipam');
  const networkName = 'kata-ts-test';
  const bridge = 'kts0';
  // A unique local /64 (RFC 4193), as private as the IPv4 subnet and as confined to the namespace.
  // Written as addresses come back from CNI (RFC 5952: no leading zeros in a group), so a test may
  // compare an address's text with it: "0a3f" would never prefix "fd6b:a3f:...".
  const group = (hex: string) => Number.parseInt(hex, 16).toString(16);
  const prefix6 = `fd6b:${group(tag.slice(0, 4))}:${group(`${tag.slice(4, 6)}00`)}:1`;
  await fsp.mkdir(cniConfDir);
  await fsp.writeFile(
    path.join(cniConfDir, '10-kata-ts-test.conflist'),
    JSON.stringify(
      {
        cniVersion: '1.0.0',
        name: networkName,
        plugins: [
          {
            type: 'bridge',
            bridge,
            isGateway: true,
            ipMasq: false,
            hairpinMode: true,
            ipam: {
              type: 'host-local',
              dataDir: ipamDir,
              ranges: [[{ subnet: `${prefix}.0/24`, gateway: `${prefix}.1` }], [{ subnet: `${prefix6}::/64`, gateway: `${prefix6}::1` }]],
              routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0' }],
            },
          },
          { type: 'portmap', capabilities: { portMappings: true } },
        ],
      },
      null,
      2,
    ),
  );
  await execFileAsync('ip', ['netns', 'add', name]);
  const exec = async (argv: string[], timeoutMs = 30_000): Promise<string> =>
    (await execFileAsync('nsenter', [`--net=${netnsPath}`, '--', ...argv], { timeout: timeoutMs })).stdout;
  await exec(['ip', 'link', 'set', 'dev', 'lo', 'up']);
  const relays = new Set<() => Promise<void>>();
  const relayLoopbackPort = async (port: number): Promise<() => Promise<void>> => {
    const sock = path.join(dir, `relay-${port}.sock`);
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
    const child = spawn('nsenter', [`--net=${netnsPath}`, '--', process.execPath, '-e', RELAY_SCRIPT, String(port), sock], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const stop = async (): Promise<void> => {
      relays.delete(stop);
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await gone;
      }
      await new Promise<void>((r) => server.close(() => r()));
    };
    relays.add(stop);
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.once('data', () => resolve());
        child.once('exit', (code) => reject(new Error(`the relay for port ${port} in ${name} exited with ${code}`)));
      });
    } catch (err) {
      await stop();
      throw err;
    }
    return stop;
  };
  return {
    relayLoopbackPort,
    name,
    netnsPath,
    dir,
    cniConfDir,
    ipamDir,
    networkName,
    prefix,
    subnet: `${prefix}.0/24`,
    gateway: `${prefix}.1`,
    subnet6: `${prefix6}::/64`,
    gateway6: `${prefix6}::1`,
    bridge,
    exec,
    httpGet: (url, timeoutMs = 5000) =>
      exec(
        [
          process.execPath,
          '-e',
          `fetch(${JSON.stringify(url)}, { signal: AbortSignal.timeout(${timeoutMs}) }).then((r) => r.text()).then((t) => process.stdout.write(t))`,
        ],
        timeoutMs + 5000,
      ),
    networkConfig: () => ({ mode: 'cni', cniConfDir, cniBinDirs: ['/opt/cni/bin', DEBIAN_CNI_BIN_DIR] }),
    allocations: async () =>
      (await fsp.readdir(path.join(ipamDir, networkName)).catch(() => [] as string[])).filter((n) =>
        /^(\d+\.\d+\.\d+\.\d+|[0-9a-f:]+)$/.test(n),
      ),
    links: async () => {
      const out = await exec(['ip', '-j', 'link', 'show']);
      return (JSON.parse(out) as Array<{ ifname: string }>).map((l) => l.ifname);
    },
    async cleanup(podNetnsNames = []) {
      for (const stop of [...relays]) await stop();
      for (const pod of podNetnsNames) await execFileAsync('ip', ['netns', 'del', pod]).catch(() => undefined);
      // Namespaces a test or bench added next to the node (`<name>-...`), then the node itself.
      for (const extra of (await fsp.readdir('/run/netns').catch(() => [] as string[])).filter((n) => n.startsWith(`${name}-`))) {
        await execFileAsync('ip', ['netns', 'del', extra]).catch(() => undefined);
      }
      await execFileAsync('ip', ['netns', 'del', name]).catch(() => undefined);
      await fsp.rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Names of pod namespaces (`kata-ts-<16 hex>`) that exist now and that `runtime` made or began to
 * make (ownNetnsNames): /run/netns is the machine's, and other runs' pods and leftovers are there too.
 */
export async function podNetnsNames(runtime: Pick<TestRuntime, 'stateDir' | 'logFile'>): Promise<string[]> {
  const own = new Set(await ownNetnsNames(runtime));
  return (await fsp.readdir('/run/netns').catch(() => [] as string[])).filter((n) => /^kata-ts-[0-9a-f]{16}$/.test(n) && own.has(n)).sort();
}
