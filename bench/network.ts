/**
 * Pod networking, side by side with a baseline in the same run, all inside a node namespace of the
 * bench's own (test/helpers/network-node.ts; nothing touches the host's network):
 *
 * 1. TCP throughput node namespace -> pod (a container's busybox nc handing the stream to `wc -c`,
 *    which answers once it has read every byte), against
 *    the same transfer to a plain network namespace on the same bridge (veth, same busybox nc):
 *    ratio pod / plain of the MiB/s.
 * 2. HTTP request latency node namespace -> pod (busybox httpd in a container), against busybox
 *    httpd in the plain namespace: ratio of the medians.
 * 3. What CNI + TAP wiring adds to RunPodSandbox: namespace + CNI ADD + TAP and tc filters, and
 *    their teardown, repeated without a VM (PodNetworks in the node namespace), beside the measured
 *    RunPodSandbox of the bench's pod.
 *
 * Rounds alternate which side goes first. Nothing is asserted.
 *
 *   node --import tsx bench/network.ts [--rounds N] [--mib M] [--requests R] [--json]
 */

import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { netnsNameFor } from '../src/network/index.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { createNetworkNode, type NetworkNode } from '../test/helpers/network-node.js';
import { createTestRuntime, podConfig } from '../test/helpers/runtime-daemon.js';
import { median } from './lib/proc.js';

const execFileAsync = promisify(execFile);
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const NC_PORT = 5001;
const HTTP_PORT = 8080;

export interface NetworkBenchResult {
  rounds: number;
  mib: number;
  requests: number;
  podMiBps: number[];
  plainMiBps: number[];
  podLatencyMs: number[];
  plainLatencyMs: number[];
  runPodSandboxMs: number;
  setupMs: number[];
  teardownMs: number[];
}

async function client(node: NetworkNode, job: Record<string, unknown>): Promise<Record<string, unknown>> {
  const { stdout } = await execFileAsync(
    'nsenter',
    [`--net=${node.netnsPath}`, '--', process.execPath, '--import', 'tsx', path.join(repo, 'bench/lib/net-client.ts'), JSON.stringify(job)],
    { cwd: repo, timeout: 300_000 },
  );
  return JSON.parse(stdout) as Record<string, unknown>;
}

/** A plain namespace on the node's bridge: a veth, the next-to-last address, busybox httpd and nc. */
async function plainPeer(node: NetworkNode, wwwDir: string): Promise<{ ip: string; stop(): Promise<void> }> {
  const name = `${node.name}-p`;
  const ip = `${node.prefix}.250`;
  const run = (argv: string[]) => execFileAsync(argv[0]!, argv.slice(1));
  await run(['ip', 'netns', 'add', name]);
  await run(['ip', '-n', node.name, 'link', 'add', 'ktsplain0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name]);
  await run(['ip', '-n', node.name, 'link', 'set', 'ktsplain0', 'master', node.bridge, 'up']);
  await run(['ip', '-n', name, 'addr', 'add', `${ip}/24`, 'dev', 'eth0']);
  await run(['ip', '-n', name, 'link', 'set', 'eth0', 'up']);
  await run(['ip', '-n', name, 'link', 'set', 'lo', 'up']);
  const children: ChildProcess[] = [
    spawn('nsenter', [`--net=/run/netns/${name}`, '--', 'busybox', 'httpd', '-f', '-p', String(HTTP_PORT), '-h', wwwDir], {
      stdio: 'ignore',
    }),
    spawn('nsenter', [`--net=/run/netns/${name}`, '--', 'sh', '-c', `while true; do busybox nc -l -p ${NC_PORT} -e busybox wc -c; done`], {
      stdio: 'ignore',
      detached: true,
    }),
  ];
  return {
    ip,
    async stop() {
      for (const c of children) {
        try {
          if (c.pid !== undefined) process.kill(c.spawnargs.includes('sh') ? -c.pid : c.pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await run(['ip', 'netns', 'del', name]).catch(() => undefined);
    },
  };
}

export async function runNetworkBench(
  rounds: number,
  mib: number,
  requests: number,
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<NetworkBenchResult> {
  const guestDir = process.env.KATA_TS_GUEST_DIR ?? path.join(repo, '.cache/guest-net');
  await execFileAsync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', guestDir]);
  const node = await createNetworkNode();
  let registry: Awaited<ReturnType<typeof startRegistry>> | undefined;
  let plain: Awaited<ReturnType<typeof plainPeer>> | undefined;
  const rt = await createTestRuntime(
    {
      logLevel: 'info',
      network: node.networkConfig(),
      hypervisor: {
        kernelPath: path.join(guestDir, 'vmlinuz'),
        initrdPath: path.join(guestDir, 'initramfs.cpio.gz'),
        guestImagePath: path.join(guestDir, 'guest.img'),
      },
    },
    { cgroupPrefix: 'kata-ts-bench-', tmpPrefix: 'ktb-' },
  );
  let sid: string | undefined;
  try {
    registry = await startRegistry();
    const image = await pushBusyboxImage(registry, 'bench/busybox', '1.0', ['sleep', 'httpd', 'nc', 'mkdir', 'echo', 'wc']);
    await allowLoopbackRegistries(rt);
    // Pulled from the host's loopback registry first; then the daemon runs in the node namespace.
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    await rt.stop();
    rt.netnsPath = node.netnsPath;
    await rt.start();
    const sandboxConfig = { ...podConfig(rt, 'netbench'), log_directory: path.join(rt.dir, 'logs') };
    const t0 = performance.now();
    sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig }, { deadline: Date.now() + 180_000 })).pod_sandbox_id;
    const runPodSandboxMs = performance.now() - t0;
    const status = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid });
    const podIp = status.status!.network!.ip;
    // The baseline joins the bridge CNI made for the pod.
    const www = path.join(node.dir, 'www');
    await fsp.mkdir(www);
    await fsp.writeFile(path.join(www, 'index.html'), 'ok\n');
    plain = await plainPeer(node, www);
    const plainIp = plain.ip;
    const { container_id: cid } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: sid,
      config: {
        metadata: { name: 'srv', attempt: 0 },
        image: { image },
        command: [
          'sh',
          '-c',
          `mkdir -p /www && echo ok > /www/index.html && httpd -p ${HTTP_PORT} -h /www && while true; do nc -l -p ${NC_PORT} -e wc -c; done`,
        ],
        log_path: 'srv.log',
      },
      sandbox_config: sandboxConfig,
    });
    await rt.cri.runtime.StartContainer({ container_id: cid });
    // Warm-up (and wait for the servers), not counted.
    for (let i = 0; ; i++) {
      try {
        await client(node, { kind: 'latency', host: podIp, port: HTTP_PORT, requests: 2 });
        break;
      } catch (err) {
        if (i > 60) throw err;
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    await client(node, { kind: 'latency', host: plainIp, port: HTTP_PORT, requests: 2 });
    const r: NetworkBenchResult = {
      rounds,
      mib,
      requests,
      podMiBps: [],
      plainMiBps: [],
      podLatencyMs: [],
      plainLatencyMs: [],
      runPodSandboxMs,
      setupMs: [],
      teardownMs: [],
    };
    for (let i = 0; i < rounds; i++) {
      const sides: Array<[string, number[], number[]]> = [
        [podIp, r.podMiBps, r.podLatencyMs],
        [plainIp, r.plainMiBps, r.plainLatencyMs],
      ];
      for (const [host, mibps, lat] of i % 2 === 0 ? sides : sides.reverse()) {
        const tp = (await client(node, { kind: 'throughput', host, port: NC_PORT, mib })) as { ms: number };
        mibps.push(mib / (tp.ms / 1000));
        // busybox nc is restarted by its loop between transfers.
        await new Promise((res) => setTimeout(res, 300));
        const l = (await client(node, { kind: 'latency', host, port: HTTP_PORT, requests })) as { ms: number[] };
        lat.push(median(l.ms));
      }
      progress(
        `round ${i + 1}/${rounds}: pod ${r.podMiBps.at(-1)!.toFixed(1)} MiB/s ${r.podLatencyMs.at(-1)!.toFixed(2)} ms, plain ${r.plainMiBps.at(-1)!.toFixed(1)} MiB/s ${r.plainLatencyMs.at(-1)!.toFixed(2)} ms`,
      );
    }
    const w = (await client(node, {
      kind: 'wiring',
      rounds: Math.max(5, rounds),
      network: { ...node.networkConfig(), cniTimeoutMs: 30_000 },
    })) as {
      setupMs: number[];
      teardownMs: number[];
    };
    r.setupMs = w.setupMs;
    r.teardownMs = w.teardownMs;
    return r;
  } finally {
    if (sid !== undefined) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid }).catch(() => undefined);
    await rt.cleanup();
    await plain?.stop();
    await node.cleanup(sid === undefined ? [] : [netnsNameFor(sid)]);
    await registry?.stop();
  }
}

export function formatNetworkReport(r: NetworkBenchResult): string {
  const m = (v: number[]) => median(v);
  return [
    `pod networking (${r.rounds} rounds, alternating; ${r.mib} MiB per transfer, ${r.requests} HTTP requests per round)`,
    `  TCP node -> pod      median ${m(r.podMiBps).toFixed(1)} MiB/s`,
    `  TCP node -> plain ns median ${m(r.plainMiBps).toFixed(1)} MiB/s (baseline, same bridge)`,
    `  ratio pod / plain throughput: ${(m(r.podMiBps) / m(r.plainMiBps)).toFixed(3)}`,
    `  HTTP GET node -> pod      median ${m(r.podLatencyMs).toFixed(2)} ms`,
    `  HTTP GET node -> plain ns median ${m(r.plainLatencyMs).toFixed(2)} ms (baseline)`,
    `  ratio pod / plain latency: ${(m(r.podLatencyMs) / m(r.plainLatencyMs)).toFixed(2)}`,
    `  netns + CNI ADD + TAP wiring  median ${m(r.setupMs).toFixed(0)} ms (teardown: TAP, CNI DEL, netns ${m(r.teardownMs).toFixed(0)} ms)`,
    `  RunPodSandbox of the bench pod ${r.runPodSandboxMs.toFixed(0)} ms: networking is ${((100 * m(r.setupMs)) / r.runPodSandboxMs).toFixed(1)} % of it`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '5' },
      mib: { type: 'string', default: '32' },
      requests: { type: 'string', default: '30' },
      json: { type: 'boolean', default: false },
    },
  });
  const result = await runNetworkBench(Number(values.rounds), Number(values.mib), Number(values.requests));
  process.stdout.write(values.json ? `${JSON.stringify({ bench: 'network', ...result })}\n` : `${formatNetworkReport(result)}\n`);
}
