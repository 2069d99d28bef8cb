/**
 * `containerd-shim-kata-ts-v2 ... start` on its own, without containerd or a VM: what one `start`
 * costs (wall time, and the CPU time of the start process and what it waits for, from GNU time)
 * in the cases containerd runs it, each through the Node shim alone (`node bin/...`, what
 * scripts/setup.sh links today) and through the native front (`dist/native/kata-ts-shim-start`,
 * native/shim-start.c, which answers without Node when the pod already answers and execs the
 * Node shim otherwise):
 *
 * - **container**: a container's start, the pod's socket answering (every container of every pod
 *   in both shim modes; a socket listener of this bench's stands for the pod's server);
 * - **sandbox, pod mode**: a pod's first start, which spawns the pod's `serve` and waits until it
 *   answers (the serve process is ended afterwards; no VM is booted: serve boots none before
 *   containerd's calls);
 * - **sandbox, node mode, server up / server down**: a pod's first start in node mode, which
 *   attaches the pod to the node server (started first when down) and starts its relay.
 *
 * The config has `mountNamespacePath: null` (no nsenter: this bench touches no mount namespace of
 * the node's), so the sandbox cases lack the nsenter a default config adds. Every process this
 * bench started is ended by pid, and its temporary dir removed.
 *
 *   node --import tsx bench/shim-start.ts [--runs N] [--json]
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { packageRoot } from '../src/common/paths.js';
import { currentCommit } from './lib/commit.js';
import { median, processArgs, sleep } from './lib/proc.js';
import { distStaleness, GNU_TIME } from './lib/shim-binary.js';

const FRONT = path.join(packageRoot(), 'dist', 'native', 'kata-ts-shim-start');
const SHIM = path.join(packageRoot(), 'bin', 'containerd-shim-kata-ts-v2');
const NAMESPACE = 'k8s.io';

/** One `start`: wall time measured here, CPU time (user + system) and peak RSS from GNU time. */
export interface StartRun {
  wallMs: number;
  cpuMs: number;
  maxRssKiB: number;
}

export interface StartCase {
  name: string;
  via: 'node' | 'front';
  runs: StartRun[];
  medianWallMs: number;
  medianCpuMs: number;
}

export interface ShimStartBenchResult {
  commit: string | null;
  load: number[];
  cases: StartCase[];
}

/** GNU time's `-f '%e %U %S %M'` line: elapsed, user, system seconds, peak RSS KiB. */
export function parseTimeLine(text: string): { cpuMs: number; maxRssKiB: number } | undefined {
  const m = /^([\d.]+) ([\d.]+) ([\d.]+) (\d+)$/m.exec(text);
  if (m === null) return undefined;
  return { cpuMs: (Number(m[2]) + Number(m[3])) * 1000, maxRssKiB: Number(m[4]) };
}

function run(argv: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(argv[0]!, argv.slice(1), { env, timeout: 120_000 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1;
      resolve({ code, stdout, stderr });
    });
    child.stdin?.end();
  });
}

function socketPath(stateRoot: string, address: string, sandboxId: string): string {
  return path.join(
    stateRoot,
    's',
    createHash('sha256')
      .update(path.posix.join(address, NAMESPACE, sandboxId))
      .digest('hex'),
  );
}

/** Every process whose command line mentions `needle` (this bench's dir): what it started. */
function pidsMentioning(needle: string): number[] {
  return processArgs()
    .filter((p) => p.pid !== process.pid && p.args.some((a) => a.includes(needle)))
    .map((p) => p.pid);
}

async function endProcesses(needle: string): Promise<void> {
  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    const pids = pidsMentioning(needle);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, signal);
      } catch {
        // gone already
      }
    }
    for (let i = 0; i < 100 && pidsMentioning(needle).length > 0; i++) await sleep(50);
  }
}

export async function runShimStartBench(runs: number): Promise<ShimStartBenchResult> {
  const stale = distStaleness(packageRoot());
  if (stale !== null) throw new Error(`dist/ is stale (${stale}): run npm run build first`);
  if (!existsSync(FRONT)) throw new Error(`${FRONT} is missing: run scripts/build-native.sh`);
  if (!existsSync(GNU_TIME)) throw new Error(`${GNU_TIME} is missing (Debian's time package)`);
  const dir = await fsp.mkdtemp('/tmp/kss-'); // short: the pod's sockets must fit in sun_path;
  const address = path.join(dir, 'containerd.sock');
  const cases: StartCase[] = [];
  const servers: net.Server[] = [];
  try {
    const configs: Record<'pod' | 'node', string> = { pod: '', node: '' };
    for (const mode of ['pod', 'node'] as const) {
      configs[mode] = path.join(dir, `${mode}.json`);
      await fsp.writeFile(
        configs[mode],
        JSON.stringify({
          stateDir: path.join(dir, 'unused-state'),
          socketPath: path.join(dir, 'unused.sock'),
          metricsAddress: null,
          cgroupDriver: 'cgroupfs',
          logLevel: 'info',
          network: { mode: 'none' },
          mountNamespacePath: null,
          shim: { stateRoot: path.join(dir, mode[0]!), mode },
        }),
      );
    }
    const timeFile = path.join(dir, 'time.out');
    let bundleSeq = 0;
    const bundleSandbox = new Map<string, string>();
    const bundleFor = async (annotations: Record<string, string>): Promise<string> => {
      const b = path.join(dir, 'bundles', String(bundleSeq++));
      await fsp.mkdir(b, { recursive: true });
      await fsp.writeFile(path.join(b, 'config.json'), JSON.stringify({ ociVersion: '1.1.0', process: { args: ['sleep'] }, annotations }));
      return b;
    };
    const startOnce = async (mode: 'pod' | 'node', via: 'node' | 'front', id: string, bundle: string): Promise<StartRun> => {
      const shimArgs = [
        '-namespace',
        NAMESPACE,
        '-address',
        address,
        '-publish-binary',
        '/bin/true',
        '-id',
        id,
        '-bundle',
        bundle,
        'start',
      ];
      const argv = via === 'node' ? [process.execPath, SHIM, ...shimArgs] : [FRONT, process.execPath, SHIM, '--', ...shimArgs];
      const env: NodeJS.ProcessEnv = { ...process.env, KATA_TS_CONFIG: configs[mode] };
      delete env.KATA_TS_SHIM_TSX;
      const t0 = performance.now();
      const r = await run([GNU_TIME, '-o', timeFile, '-f', '%e %U %S %M', ...argv], env);
      const wallMs = performance.now() - t0;
      if (r.code !== 0) throw new Error(`start ${id} (${mode}, ${via}) exited ${r.code}: ${r.stderr.trim()}`);
      const expected = `unix://${socketPath(path.join(dir, mode[0]!), address, id.startsWith('c-') ? bundleSandbox.get(bundle)! : id)}`;
      if (r.stdout !== expected) throw new Error(`start ${id} printed ${JSON.stringify(r.stdout)}, not ${expected}`);
      const timed = parseTimeLine(readFileSync(timeFile, 'utf8'));
      if (timed === undefined) throw new Error(`GNU time wrote nothing usable for start ${id}`);
      return { wallMs, ...timed };
    };
    const record = (name: string, via: 'node' | 'front', list: StartRun[]): void => {
      cases.push({ name, via, runs: list, medianWallMs: median(list.map((r) => r.wallMs)), medianCpuMs: median(list.map((r) => r.cpuMs)) });
    };

    // Containers: a listener of ours on the pod's socket stands for the pod's server.
    for (const mode of ['pod', 'node'] as const) {
      const sandboxId = `sb-${mode}-listening`;
      const sock = socketPath(path.join(dir, mode[0]!), address, sandboxId);
      await fsp.mkdir(path.dirname(sock), { recursive: true, mode: 0o700 });
      const server = net.createServer((c) => c.destroy());
      servers.push(server);
      await new Promise<void>((resolve) => server.listen(sock, resolve));
      const byVia: Record<'node' | 'front', StartRun[]> = { node: [], front: [] };
      // A first Node start leaves the config's stamp (start-stamp.ts), as the sandbox's start does on a node.
      for (let i = 0; i < runs; i++) {
        for (const via of i % 2 === 0 ? (['node', 'front'] as const) : (['front', 'node'] as const)) {
          const b = await bundleFor({ 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': sandboxId });
          bundleSandbox.set(b, sandboxId);
          byVia[via].push(await startOnce(mode, via, `c-${mode}-${via}-${i}`, b));
        }
      }
      record(`container (${mode} mode, the pod's socket answering)`, 'node', byVia.node);
      record(`container (${mode} mode, the pod's socket answering)`, 'front', byVia.front);
    }

    // Sandboxes: a pod's first start; its server is ended after each run (by the dir in its command line).
    const sandboxRuns = Math.max(1, Math.ceil(runs / 2));
    for (const [mode, label, keepServer] of [
      ['pod', 'sandbox, pod mode (spawns serve)', false],
      ['node', 'sandbox, node mode, node server down (spawns node-serve and a relay)', false],
      ['node', 'sandbox, node mode, node server up (attach and a relay)', true],
    ] as const) {
      const byVia: Record<'node' | 'front', StartRun[]> = { node: [], front: [] };
      if (keepServer) {
        // Bring the node server up with one pod, left attached for the runs.
        const b = await bundleFor({ 'io.kubernetes.cri.container-type': 'sandbox' });
        await startOnce(mode, 'node', 'sb-keeper', b);
      }
      for (let i = 0; i < sandboxRuns; i++) {
        for (const via of i % 2 === 0 ? (['node', 'front'] as const) : (['front', 'node'] as const)) {
          // Distinct in their first 16 characters: they name the pods' state dirs.
          const id = `s${i}${via[0]}${mode[0]}${keepServer ? 'u' : 'd'}-sandbox`;
          const b = await bundleFor({ 'io.kubernetes.cri.container-type': 'sandbox' });
          byVia[via].push(await startOnce(mode, via, id, b));
          if (!keepServer) await endProcesses(dir);
        }
      }
      if (keepServer) await endProcesses(dir);
      record(label, 'node', byVia.node);
      record(label, 'front', byVia.front);
    }
    return { commit: currentCommit(), load: os.loadavg(), cases };
  } finally {
    for (const s of servers) s.close();
    await endProcesses(dir);
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

export function formatShimStartReport(r: ShimStartBenchResult): string {
  const lines = [
    `shim start at ${r.commit ?? '(no commit)'}, load ${r.load.map((l) => l.toFixed(1)).join(' ')}`,
    '  case | via | median wall ms | median CPU ms | runs (wall ms)',
  ];
  for (const c of r.cases) {
    lines.push(
      `  ${c.name} | ${c.via} | ${c.medianWallMs.toFixed(1)} | ${c.medianCpuMs.toFixed(0)} | ${c.runs.map((x) => x.wallMs.toFixed(0)).join(' ')}`,
    );
  }
  return lines.join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '10' }, json: { type: 'boolean', default: false } } });
  const result = await runShimStartBench(Number.parseInt(values.runs, 10));
  console.log(values.json ? JSON.stringify(result) : formatShimStartReport(result));
}
