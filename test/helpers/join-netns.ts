/**
 * A pod network namespace as containerd's CNI leaves it, made by hand for tests of joining one
 * (SandboxRunOptions.joinNetns): a "node" namespace and a "pod" namespace of the test's own, a
 * veth pair between them, `eth0` in the pod with an IPv4 address, a MAC and an MTU of the test's
 * choosing and a default route via the node side (the gateway), which also has an address in a
 * second subnet (off the pod's, so reaching it proves the pod's routes). Nothing is in the host's
 * own namespace; cleanup() removes both namespaces (the veth pair goes with them) and kills the
 * processes started in them. vitest-free.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

export interface JoinNamespaces {
  node: string;
  pod: string;
  /** `/run/netns/<pod>`. */
  podPath: string;
  nodePath: string;
  /** The pod's address on eth0 and its prefix length. */
  podIp: string;
  prefixLength: number;
  /** The node side's address in the pod's subnet: the pod's default gateway. */
  gateway: string;
  /** A node address outside the pod's subnet: the pod reaches it only through its default route. */
  offSubnet: string;
  mac: string;
  mtu: number;
  /** Run a command inside a namespace of these (`nsenter --net=`). */
  exec(ns: 'node' | 'pod', argv: string[], timeoutMs?: number): Promise<string>;
  /**
   * A process sleeping in the pod namespace, for its `/proc/<pid>/ns/net`: the same namespace
   * by a path outside /run/netns. Killed by cleanup().
   */
  holdByPid(): Promise<number>;
  /**
   * From the node namespace, a TCP connection to the pod's address from `from` (one of the node's
   * addresses): `refused` (something with the pod's address answered with a reset), `connected`,
   * or `timeout` (nothing answered: no ARP reply, or no route back).
   */
  probe(from: string, port?: number, timeoutMs?: number): Promise<'refused' | 'connected' | 'timeout' | string>;
  cleanup(): Promise<void>;
}

const PROBE = `
const net = require('node:net');
const [host, port, from, ms] = process.argv.slice(1);
const s = net.connect({ host, port: Number(port), localAddress: from });
const done = (r) => { process.stdout.write(r); s.destroy(); process.exit(0); };
s.setTimeout(Number(ms), () => done('timeout'));
s.on('connect', () => done('connected'));
s.on('error', (e) => done(e.code === 'ECONNREFUSED' ? 'refused' : String(e.code)));
`;

export async function createJoinNamespaces(): Promise<JoinNamespaces> {
  const tag = randomBytes(3).toString('hex');
  const node = `kts-join-${tag}`;
  const pod = `kts-join-${tag}-pod`;
  // 10.200.0.0/16 - 10.254.0.0/16: private, only ever routed inside these namespaces.
  const a = 200 + (Number.parseInt(tag.slice(0, 2), 16) % 55);
  const b = Number.parseInt(tag.slice(2, 4), 16);
  const prefix = `10.${a}.${b}`;
  const offPrefix = `10.${a}.${(b + 128) % 256}`;
  const mac = `0a:58:0a:${a.toString(16)}:${tag.slice(2, 4)}:02`;
  const mtu = 1400;
  const children = new Set<ChildProcess>();
  const ns = {
    node,
    pod,
    podPath: `/run/netns/${pod}`,
    nodePath: `/run/netns/${node}`,
    podIp: `${prefix}.2`,
    prefixLength: 24,
    gateway: `${prefix}.1`,
    offSubnet: `${offPrefix}.1`,
    mac,
    mtu,
  };
  const exec = async (where: 'node' | 'pod', argv: string[], timeoutMs = 20_000): Promise<string> =>
    (await execFileAsync('nsenter', [`--net=/run/netns/${where === 'node' ? node : pod}`, '--', ...argv], { timeout: timeoutMs })).stdout;
  const cleanup = async (): Promise<void> => {
    for (const child of children) {
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await gone;
      }
    }
    children.clear();
    for (const name of [pod, node]) await execFileAsync('ip', ['netns', 'del', name]).catch(() => undefined);
  };
  try {
    const veth = `ktsj${tag}`;
    await execFileAsync('ip', ['netns', 'add', node]);
    await execFileAsync('ip', ['netns', 'add', pod]);
    for (const [where, argv] of [
      ['node', ['ip', 'link', 'set', 'dev', 'lo', 'up']],
      ['pod', ['ip', 'link', 'set', 'dev', 'lo', 'up']],
      ['node', ['ip', 'link', 'add', veth, 'mtu', String(mtu), 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod]],
      ['node', ['ip', 'addr', 'add', `${ns.gateway}/24`, 'dev', veth]],
      ['node', ['ip', 'addr', 'add', `${ns.offSubnet}/24`, 'dev', veth]],
      ['node', ['ip', 'link', 'set', 'dev', veth, 'up']],
      ['pod', ['ip', 'link', 'set', 'dev', 'eth0', 'address', mac, 'mtu', String(mtu)]],
      ['pod', ['ip', 'addr', 'add', `${ns.podIp}/24`, 'dev', 'eth0']],
      ['pod', ['ip', 'link', 'set', 'dev', 'eth0', 'up']],
      ['pod', ['ip', 'route', 'add', 'default', 'via', ns.gateway, 'dev', 'eth0']],
    ] as const) {
      await exec(where, [...argv]);
    }
  } catch (err) {
    await cleanup();
    throw err;
  }
  return {
    ...ns,
    exec,
    async holdByPid() {
      const child = spawn('nsenter', [`--net=${ns.podPath}`, '--', 'sleep', '600'], { stdio: 'ignore' });
      children.add(child);
      await new Promise<void>((resolve, reject) => {
        child.once('spawn', () => resolve());
        child.once('error', reject);
      });
      // nsenter execs sleep in the same process once it has entered the namespace.
      for (let i = 0; i < 100; i++) {
        const cmd = await execFileAsync('cat', [`/proc/${child.pid}/comm`]).catch(() => ({ stdout: '' }));
        if (cmd.stdout.trim() === 'sleep') break;
        await new Promise((r) => setTimeout(r, 20));
      }
      return child.pid!;
    },
    probe: async (from, port = 9, timeoutMs = 3000) =>
      (await exec('node', [process.execPath, '-e', PROBE, ns.podIp, String(port), from, String(timeoutMs)], timeoutMs + 10_000)).trim(),
    cleanup,
  };
}
