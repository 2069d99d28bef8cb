/**
 * containerd's own port-forward reaching a kata-ts pod's guest (src/shim/port-forward.ts): the real
 * containerd (Debian's 1.6.20) answers CRI PortForward by dialling 127.0.0.1:<port> inside the pod's
 * network namespace; the shim's door there (an iptables REDIRECT to kata-ts-portfwd, relayed
 * through the agent) must bring that connection to a busybox httpd listening in the guest. One VM.
 *
 * containerd's streaming server listens on 127.0.0.1 in the harness node's network namespace: the
 * test reaches it through a relay of its own (TCP here -> a unix socket -> a node process in that
 * namespace -> the streaming port), loopback only.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import {
  PORT_FORWARD_RULE_COMMENT,
  PORT_FORWARD_SOCKET,
  planPortForwardRule,
  removeStalePortForwardRules,
} from '../../../src/shim/port-forward.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { until } from '../../helpers/poll.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { SpdyClient, spdyPortForward } from '../../helpers/streaming-client.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const MISSING = containerdMissing();
const HELPER = path.resolve('dist/native/kata-ts-portfwd');
const NOT_BUILT = existsSync(HELPER) ? null : `${HELPER} is not built (scripts/build-native.sh)`;
if (MISSING !== null || NOT_BUILT !== null) console.warn(`the shim's port-forward test skipped: ${MISSING ?? NOT_BUILT}`);

/** The node-side half of the streaming relay: unix socket -> 127.0.0.1:<port> in the node's namespace. */
const NODE_RELAY_SCRIPT = `
const net = require('node:net');
const [port, sock] = process.argv.slice(1);
net.createServer((c) => {
  const t = net.connect(Number(port), '127.0.0.1');
  c.pipe(t); t.pipe(c);
  c.on('error', () => t.destroy()); t.on('error', () => c.destroy());
  c.on('close', () => t.destroy()); t.on('close', () => c.destroy());
}).listen(sock, () => process.stdout.write('ready\\n'));
`;

describe.skipIf(MISSING !== null || NOT_BUILT !== null)("containerd's port-forward into a kata-ts pod's guest", () => {
  const node = new ShimNode('/tmp/ktp-');
  const uid = randomUUID();
  let podId = '';
  let netnsPath = '';
  /** A process of ours in the pod's namespace, holding it after containerd removes its name. */
  let holder: ChildProcess | undefined;
  let relayChild: ChildProcess | undefined;
  let relayServer: net.Server | undefined;
  let relayPort = 0;
  const config = (logDir: string): PodSandboxConfig => ({
    metadata: { name: 'pf', uid, namespace: 'default', attempt: 0 },
    hostname: 'pf-pod',
    log_directory: logDir,
    linux: { cgroup_parent: `/kubepods/burstable/pod${uid}` },
  });
  const inPodNetns = async (argv: string[]): Promise<string> =>
    (await execFileAsync('nsenter', [`--net=/proc/${holder!.pid}/ns/net`, '--', ...argv])).stdout;
  const doorHelpers = () =>
    liveProcessesMentioning(node.stateRoot).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('kata-ts-portfwd'));
  /** The URL containerd answered, pointed at our relay to its streaming server. */
  const forwardUrl = async (ports: number[]): Promise<string> => {
    const url = new URL((await node.cri.runtime.PortForward({ pod_sandbox_id: podId, port: ports })).url);
    if (relayServer === undefined) await startRelay(Number(url.port));
    url.host = `127.0.0.1:${relayPort}`;
    return url.toString();
  };
  const startRelay = async (streamPort: number): Promise<void> => {
    const sock = path.join(node.dir, 'stream-relay.sock');
    relayChild = spawn(
      'nsenter',
      [`--target=${node.ctrd.nodePid}`, '--net', '--', process.execPath, '-e', NODE_RELAY_SCRIPT, String(streamPort), sock],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve, reject) => {
      relayChild!.stdout!.once('data', () => resolve());
      relayChild!.once('exit', (code) => reject(new Error(`the streaming relay exited (${code})`)));
    });
    relayServer = net.createServer((c) => {
      const u = net.connect(sock);
      c.pipe(u);
      u.pipe(c);
      c.on('error', () => u.destroy());
      u.on('error', () => c.destroy());
      c.on('close', () => u.destroy());
      u.on('close', () => c.destroy());
    });
    await new Promise<void>((resolve, reject) => relayServer!.once('error', reject).listen(0, '127.0.0.1', resolve));
    relayPort = (relayServer.address() as net.AddressInfo).port;
  };
  const get = (file: string) => Buffer.from(`GET /${file} HTTP/1.0\r\n\r\n`);

  beforeAll(async () => {
    await node.start();
    const image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'portfwd', ['httpd', 'mkdir', 'head', 'tr', 'sleep']);
    await node.cri.image.PullImage({ image: { image } });
    const logDir = await node.podLogDir('pf', uid);
    podId = (
      await node.cri.runtime.RunPodSandbox(
        { config: config(logDir), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    const spec = JSON.parse(await node.ctrd.nodeExec(['cat', path.join(node.ctrd.bundleDir(podId), 'config.json')])) as {
      linux?: { namespaces?: { type: string; path?: string }[] };
    };
    netnsPath = spec.linux?.namespaces?.find((n) => n.type === 'network')?.path ?? '';
    holder = spawn('nsenter', [`--target=${node.ctrd.nodePid}`, '--mount', '--', 'nsenter', `--net=${netnsPath}`, '--', 'sleep', '3600'], {
      stdio: 'ignore',
    });
    const { container_id } = await node.cri.runtime.CreateContainer({
      pod_sandbox_id: podId,
      config: {
        metadata: { name: 'web', attempt: 0 },
        image: { image },
        command: [
          'sh',
          '-c',
          'mkdir -p /tmp/www && echo hello-from-guest > /tmp/www/index.html && ' +
            "head -c 1048576 /dev/zero | tr '\\0' a > /tmp/www/a && head -c 1048576 /dev/zero | tr '\\0' b > /tmp/www/b && " +
            'exec httpd -f -p 8080 -h /tmp/www',
        ],
        log_path: 'web.log',
      },
      sandbox_config: config(logDir),
    });
    await node.cri.runtime.StartContainer({ container_id });
  }, scaledMs(600_000));

  afterAll(async () => {
    if (podId !== '') {
      await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
      await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
    }
    if (relayChild?.pid !== undefined && relayChild.exitCode === null) process.kill(relayChild.pid, 'SIGKILL');
    await new Promise<void>((resolve) => (relayServer === undefined ? resolve() : relayServer.close(() => resolve())));
    if (holder?.pid !== undefined && holder.exitCode === null) process.kill(holder.pid, 'SIGKILL');
    await node.stop();
  }, scaledMs(300_000));

  it("the door exists only in the pod's namespace: one REDIRECT rule on lo, one listener on 127.0.0.1, its helper", async () => {
    expect(netnsPath).not.toBe('');
    const rules = (await inPodNetns(['iptables', '-w', '-t', 'nat', '-S', 'OUTPUT']))
      .split('\n')
      .filter((l) => l.includes(PORT_FORWARD_RULE_COMMENT));
    expect(rules).toHaveLength(1);
    expect(rules[0]).toMatch(/-d 127\.0\.0\.1\/32 -o lo -p tcp .*-j REDIRECT --to-ports \d+/);
    const listeners = (await inPodNetns(['ss', '-Hltn']))
      .trim()
      .split('\n')
      .filter((l) => l !== '');
    expect(listeners).toHaveLength(1);
    expect(listeners[0]).toContain('127.0.0.1:');
    expect(doorHelpers()).toHaveLength(1);
    // The host's own nat table holds nothing of it.
    expect(await execFileAsync('iptables', ['-w', '-t', 'nat', '-S']).then((r) => r.stdout)).not.toContain(PORT_FORWARD_RULE_COMMENT);
  });

  it("containerd's PortForward reaches httpd in the guest: a request goes in, the page comes back", async () => {
    const reply = await until('httpd in the guest to answer through containerd', async (note) => {
      const r = await spdyPortForward(await forwardUrl([8080]), 8080, get('index.html'));
      note(r.error);
      return r.data.toString().includes('hello-from-guest') ? r : undefined;
    });
    expect(reply.data.toString()).toMatch(/^HTTP\/1\.[01] 200/);
    expect(reply.error).toBe('');
  });

  it('two connections at once, each its own file of 1 MiB, every byte', async () => {
    const client = await SpdyClient.connect(await forwardUrl([8080]), ['portforward.k8s.io']);
    try {
      const open = async (requestID: string, file: string) => {
        const error = await client.open({ streamType: 'error', port: '8080', requestID });
        const data = await client.open({ streamType: 'data', port: '8080', requestID });
        client.write(data, get(file));
        return { error, data };
      };
      const [a, b] = await Promise.all([open('1', 'a'), open('2', 'b')]);
      const [dataA, dataB, errA, errB] = await Promise.all([
        client.ended(a.data, scaledMs(120_000)),
        client.ended(b.data, scaledMs(120_000)),
        client.ended(a.error, scaledMs(120_000)),
        client.ended(b.error, scaledMs(120_000)),
      ]);
      expect([errA.toString(), errB.toString()]).toEqual(['', '']);
      const body = (d: Buffer) => d.subarray(d.indexOf('\r\n\r\n') + 4);
      expect(body(dataA).equals(Buffer.alloc(1048576, 'a'))).toBe(true);
      expect(body(dataB).equals(Buffer.alloc(1048576, 'b'))).toBe(true);
    } finally {
      client.close();
    }
  });

  it('a port nothing listens on in the guest answers as a failed connection, with no data', async () => {
    const r = await spdyPortForward(await forwardUrl([9090]), 9090, get('index.html'));
    expect(r.data.length).toBe(0);
    expect(r.error).toMatch(/9090/);
    // The listener accepted before the guest was asked: a reset, where a runc pod says "refused".
    expect(r.error).toMatch(/connection reset by peer/);
  });

  it("after StopPodSandbox nothing of the door is left in the pod's namespace: no rule, no listener, no helper", async () => {
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    expect(await inPodNetns(['iptables', '-w', '-t', 'nat', '-S', 'OUTPUT'])).not.toContain(PORT_FORWARD_RULE_COMMENT);
    expect((await inPodNetns(['ss', '-Hltn'])).trim()).toBe('');
    expect(doorHelpers()).toEqual([]);
    const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
    expect(existsSync(path.join(podDir, PORT_FORWARD_SOCKET))).toBe(false);
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    podId = '';
  });

  it("a rule a dead shim left is found by its comment and removed; anyone else's rule stays", async () => {
    const ns = `/proc/${holder!.pid}/ns/net`;
    const stale = planPortForwardRule('-A', 4000);
    const other = [
      '-w',
      '-t',
      'nat',
      '-A',
      'OUTPUT',
      '-o',
      'lo',
      '-p',
      'tcp',
      '-d',
      '127.0.0.1/32',
      '--dport',
      '5000',
      '-j',
      'REDIRECT',
      '--to-ports',
      '5001',
    ];
    await inPodNetns(['iptables', ...stale]);
    await inPodNetns(['iptables', ...other]);
    expect(await removeStalePortForwardRules(ns)).toBe(1);
    const left = await inPodNetns(['iptables', '-w', '-t', 'nat', '-S', 'OUTPUT']);
    expect(left).not.toContain(PORT_FORWARD_RULE_COMMENT);
    expect(left).toContain('--to-ports 5001');
  });
});
