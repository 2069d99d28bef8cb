/**
 * `kata-ts ps`: the pods kata-ts runs on this node, read from their state (src/shim/node-pods.ts):
 * the shims' pods under `shim.stateRoot`, and with `--standalone` the daemon's under `stateDir`
 * and its pre-booted (pooled) VMs. The reading is the only effect; the view and the table are pure
 * functions of what was read.
 */

import type { PlacementRecord } from '../cgroups/index.js';
import { loadConfig } from '../config/load.js';
import { type PodState, type PooledVmState, readPooledVms, readShimPods, readStandalonePods } from '../shim/node-pods.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const HELP = `Usage: kata-ts ps [--config FILE] [--state-root DIR] [--standalone] [--json]

Lists the pods kata-ts runs on this node, from their state: behind containerd, each pod's shim
state under shim.stateRoot (--state-root overrides the config's); with --standalone also the
kata-ts daemon's pods under its stateDir and its pooled (pre-booted) VMs, one row each (POD
pool:<id>, STATUS pooled or booting). For each: namespace, sandbox id, handler, status, the
shim's (in node mode the pod's relay's) and the VM's (QEMU's) pids and whether they run, the VM's shape
(vCPUs and memory now / the planned hot-plug maximum), uptime, containers, cgroup and the
metrics socket. A pod that is half written or whose processes died is listed as such.
--json prints the same as a JSON array.
`;

/** Why a pod (or a pooled VM: `pooled`, `booting`) is in the state it is, in one word. */
export type PodStatus = 'running' | 'stopped' | 'starting' | 'shim-gone' | 'vm-gone' | 'unreadable' | 'pooled' | 'booting';

/** One pod, or one of the daemon's pooled VMs (`source: 'pool'`), as `ps` shows it (the JSON output's element). */
export interface PodView {
  source: PodState['source'] | 'pool';
  namespace: string;
  sandboxId: string | null;
  /** A pooled VM's id (its record's); null for a pod. */
  poolVmId: string | null;
  /** The Kubernetes pod: `<namespace>/<name>` from the sandbox's metadata. */
  pod: string | null;
  handler: string | null;
  status: PodStatus;
  /**
   * `pid`: the pod's `serve`, or in node mode (`mode: 'node'`) the node server that attached it;
   * `alive`: what answers containerd for the pod runs (`serve`, or in node mode the pod's relay, `relayPid`).
   */
  shim: { pid: number; alive: boolean; startedAt: string; mode: 'pod' | 'node'; relayPid: number | null } | null;
  vm: { pid: number; startTimeTicks: number; alive: boolean } | null;
  virtiofsd: { pid: number; alive: boolean } | null;
  shape: { vcpus: number; maxVcpus: number; memoryMiB: number; maxMemoryMiB: number } | null;
  createdAt: string | null;
  uptimeSeconds: number | null;
  cgroup: { driver: string; path: string; paths: Record<string, string>; unit: string | null } | null;
  containers: number;
  metricsSocket: string | null;
  stateDir: string;
  problems: string[];
}

/** The hierarchies whose directory best names the VMM's cgroup, most telling first. */
const CGROUP_KEYS = ['unified', 'cpu', 'cpu,cpuacct', 'memory', 'systemd'];

/** The cgroup columns of a sandbox's placement or a pooled VM's (pure). */
function cgroupView(c: PlacementRecord | null): PodView['cgroup'] {
  if (c === null) return null;
  const key = CGROUP_KEYS.find((k) => c.paths[k] !== undefined) ?? Object.keys(c.paths).sort()[0];
  return {
    driver: c.driver,
    path: c.unit !== undefined ? `${c.slice ?? ''}/${c.unit}` : key === undefined ? '' : (c.paths[key] ?? ''),
    paths: { ...c.paths },
    unit: c.unit ?? null,
  };
}

function statusOf(s: PodState): PodStatus {
  const r = s.record;
  if (s.source === 'shim' && s.shim !== undefined && !s.shimAlive) return 'shim-gone';
  // No record: being created ("no ..." notes), unless something could not be read.
  if (r === undefined) return s.problems.some((p) => !p.startsWith('no ')) ? 'unreadable' : 'starting';
  if (r.phase === 'creating') return 'starting';
  if (r.phase === 'stopped') return 'stopped';
  return s.vm?.alive === true ? 'running' : 'vm-gone';
}

/** The view of one pod at `nowMs` (pure). */
export function podView(s: PodState, nowMs: number): PodView {
  const r = s.record;
  const createdMs = r === undefined ? null : Number(BigInt(r.createdAtNs) / 1_000_000n);
  const placement = r?.placement ?? null;
  return {
    source: s.source,
    namespace: s.namespace,
    sandboxId: s.shim?.sandboxId ?? r?.id ?? null,
    poolVmId: null,
    pod: r === undefined ? null : `${r.metadata.namespace}/${r.metadata.name}`,
    handler: r?.handler ?? null,
    status: statusOf(s),
    shim:
      s.shim === undefined
        ? null
        : {
            pid: s.shim.pid,
            alive: s.shimAlive,
            startedAt: s.shim.startedAt,
            mode: s.shim.node === undefined ? 'pod' : 'node',
            relayPid: s.relayPid ?? null,
          },
    vm: r?.vmm == null ? null : { pid: r.vmm.pid, startTimeTicks: r.vmm.startTimeTicks, alive: s.vm?.alive === true },
    virtiofsd: r?.virtiofsd == null ? null : { pid: r.virtiofsd.pid, alive: s.virtiofsd?.alive === true },
    shape:
      r === undefined
        ? null
        : { vcpus: r.shape.vcpus, maxVcpus: r.shape.maxVcpus, memoryMiB: r.shape.memoryMiB, maxMemoryMiB: r.shape.maxMemoryMiB },
    createdAt: createdMs === null ? null : new Date(createdMs).toISOString(),
    uptimeSeconds: createdMs === null ? null : Math.max(0, Math.floor((nowMs - createdMs) / 1000)),
    cgroup: cgroupView(placement),
    containers: s.containers,
    metricsSocket: s.metricsSocket ?? null,
    stateDir: s.stateDir,
    problems: [...s.problems],
  };
}

/**
 * The view of one of the daemon's pooled VMs at `nowMs` (pure): `pooled` once it can be claimed,
 * `booting` before, `vm-gone` when its QEMU no longer runs, `unreadable` when its record does not parse.
 */
export function pooledVmView(s: PooledVmState, nowMs: number): PodView {
  const r = s.record;
  const createdMs = r === undefined ? null : Number(BigInt(r.createdAtNs) / 1_000_000n);
  const alive = s.vm?.alive === true;
  const status: PodStatus =
    r === undefined ? 'unreadable' : r.vmm !== null && !alive ? 'vm-gone' : r.phase === 'ready' ? 'pooled' : 'booting';
  return {
    source: 'pool',
    namespace: '',
    sandboxId: null,
    poolVmId: r?.id ?? null,
    pod: null,
    handler: r?.handler ?? null,
    status,
    shim: null,
    vm: r?.vmm == null ? null : { pid: r.vmm.pid, startTimeTicks: r.vmm.startTimeTicks, alive },
    virtiofsd: null,
    shape: r === undefined ? null : { ...r.shape },
    createdAt: createdMs === null ? null : new Date(createdMs).toISOString(),
    uptimeSeconds: createdMs === null ? null : Math.max(0, Math.floor((nowMs - createdMs) / 1000)),
    cgroup: cgroupView(r?.placement ?? null),
    containers: 0,
    metricsSocket: null,
    stateDir: s.stateDir,
    problems: [...s.problems],
  };
}

/** `1d2h`, `3h4m`, `5m6s`, `7s`. */
export function formatDuration(seconds: number): string {
  const d = Math.floor(seconds / 86_400);
  const h = Math.floor((seconds % 86_400) / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (d > 0) return `${d}d${h}h`;
  if (h > 0) return `${h}h${m}m`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}

const pidText = (p: { pid: number; alive: boolean } | null): string => (p === null ? '-' : p.alive ? String(p.pid) : `${p.pid}(dead)`);

/** The SHIM column: the pod's `serve`, or in node mode its relay (the process that is the pod's own). */
const shimText = (s: PodView['shim']): string =>
  s === null ? '-' : s.mode === 'pod' ? pidText(s) : s.relayPid !== null ? `relay:${s.relayPid}` : 'relay(dead)';

/** The table `ps` prints: a header, one row per pod, columns padded; problems indented under their row (pure). */
export function formatPsTable(views: readonly PodView[]): string {
  const header = [
    'NAMESPACE',
    'SANDBOX',
    'POD',
    'HANDLER',
    'STATUS',
    'SHIM',
    'VM',
    'VCPUS',
    'MEMORY',
    'UPTIME',
    'CTRS',
    'CGROUP',
    'METRICS',
  ];
  const rows = views.map((v) => [
    v.namespace === '' ? '-' : v.namespace,
    v.sandboxId === null ? '-' : v.sandboxId.slice(0, 13),
    v.source === 'pool' ? `pool:${v.poolVmId === null ? '?' : v.poolVmId.slice(0, 13)}` : (v.pod ?? '-'),
    v.handler ?? '-',
    v.status,
    v.source === 'shim' ? shimText(v.shim) : 'daemon',
    pidText(v.vm),
    v.shape === null ? '-' : `${v.shape.vcpus}/${v.shape.maxVcpus}`,
    v.shape === null ? '-' : `${v.shape.memoryMiB}/${v.shape.maxMemoryMiB}MiB`,
    v.uptimeSeconds === null ? '-' : formatDuration(v.uptimeSeconds),
    String(v.containers),
    v.cgroup?.path || '-',
    v.metricsSocket ?? '-',
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  const out = [line(header)];
  views.forEach((v, i) => {
    out.push(line(rows[i]!));
    for (const p of v.problems) out.push(`    ! ${p}`);
  });
  return `${out.join('\n')}\n`;
}

export async function runPsCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(
    argv,
    {
      config: { type: 'string' },
      'state-root': { type: 'string' },
      standalone: { type: 'boolean' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    true,
  );
  if (values.help === true) {
    io.stdout.write(HELP);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`ps takes no arguments, got "${positionals.join(' ')}"`);
  const stateRootFlag = values['state-root'];
  if (stateRootFlag !== undefined && !stateRootFlag.startsWith('/'))
    throw new UsageError(`--state-root must be an absolute path, got "${stateRootFlag}"`);
  const needConfig = stateRootFlag === undefined || values.standalone === true;
  const config = needConfig ? (await loadConfig(values.config)).config : undefined;
  const stateRoot = stateRootFlag ?? config!.shim.stateRoot;
  const states = await readShimPods(stateRoot);
  if (values.standalone === true) states.push(...(await readStandalonePods(config!.stateDir)));
  const pooled = values.standalone === true ? await readPooledVms(config!.stateDir) : [];
  const now = Date.now();
  const views = [...states.map((s) => podView(s, now)), ...pooled.map((s) => pooledVmView(s, now))];
  if (values.json === true) io.stdout.write(`${JSON.stringify(views, null, 2)}\n`);
  else io.stdout.write(formatPsTable(views));
  return 0;
}
