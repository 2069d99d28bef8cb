/**
 * The network bench's client, run inside the node namespace (`nsenter --net=`) by bench/network.ts:
 * one JSON job on argv, one JSON result on stdout.
 *   {"kind":"throughput","host":"10.x.y.z","port":5001,"mib":32}  -> {"ms": n}
 *   {"kind":"latency","host":"10.x.y.z","port":8080,"requests":50} -> {"ms": [n, ...]}
 *   {"kind":"wiring","rounds":5,"network":{...}}                    -> {"setupMs": [...], "teardownMs": [...]}
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { silentLogger } from '../../src/common/logger.js';
import type { NetworkConfig } from '../../src/config/types.js';
import { PodNetworks } from '../../src/network/index.js';

type Job =
  | { kind: 'throughput'; host: string; port: number; mib: number }
  | { kind: 'latency'; host: string; port: number; requests: number }
  | { kind: 'wiring'; rounds: number; network: NetworkConfig };

/**
 * Send `mib` MiB; the server (busybox `nc -l -e wc -c`) answers with the byte count it read once
 * it has read everything, so the time runs until every byte was received, not just buffered.
 */
function throughput(host: string, port: number, mib: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const chunk = Buffer.alloc(1024 * 1024, 0x61);
    const sock = net.connect(port, host);
    let t0 = 0;
    let answer = '';
    sock.setEncoding('utf8');
    sock.on('error', reject);
    sock.on('connect', async () => {
      t0 = performance.now();
      for (let i = 0; i < mib; i++) if (!sock.write(chunk)) await new Promise((r) => sock.once('drain', r));
      sock.end();
    });
    sock.on('data', (d: string) => {
      answer += d;
    });
    sock.on('end', () => {
      const ms = performance.now() - t0;
      const got = Number(answer.trim());
      if (got !== mib * chunk.length) reject(new Error(`the server read ${answer.trim() || 'nothing'} bytes, not ${mib * chunk.length}`));
      else resolve(ms);
    });
  });
}

function get(host: string, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.get({ host, port, path: '/', agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(performance.now() - t0));
    });
    req.on('error', reject);
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
  });
}

async function main(job: Job): Promise<unknown> {
  if (job.kind === 'throughput') return { ms: await throughput(job.host, job.port, job.mib) };
  if (job.kind === 'latency') {
    const ms: number[] = [];
    for (let i = 0; i < job.requests; i++) ms.push(await get(job.host, job.port));
    return { ms };
  }
  // What RunPodSandbox adds for networking, without a VM: namespace + CNI ADD + TAP wiring, and back.
  const networks = new PodNetworks(job.network);
  const out = { setupMs: [] as number[], teardownMs: [] as number[] };
  for (let i = 0; i < job.rounds; i++) {
    const id = randomBytes(32).toString('hex');
    const net = await networks.prepare(id, { hostNetwork: false, portMappings: [], cniArgs: `IgnoreUnknown=1;K8S_POD_NAME=bench${i}` });
    const t0 = performance.now();
    await networks.setup(net, async () => undefined, silentLogger());
    const t1 = performance.now();
    await networks.teardown(net, async () => undefined, silentLogger());
    out.setupMs.push(t1 - t0);
    out.teardownMs.push(performance.now() - t1);
  }
  return out;
}

main(JSON.parse(process.argv[2] ?? '{}') as Job).then(
  (r) => process.stdout.write(`${JSON.stringify(r)}\n`),
  (err: unknown) => {
    process.stderr.write(`net-client: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
