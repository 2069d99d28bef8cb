/**
 * A pod's Prometheus metrics, served by its shim on `<pod state dir>/metrics.sock` (HTTP/1.1,
 * `GET /metrics`, text format 0.0.4), as each Kata shim serves kata-monitor on its
 * `shim-monitor.sock`. Read at every scrape, nothing sampled in the background:
 *
 * - the host's view of the pod's processes (QEMU, virtiofsd, this shim): alive (pid and start
 *   time), CPU seconds (utime + stime) and memory (RSS, PSS) from /proc;
 * - the VM's shape from the sandbox record (vCPUs and memory now, and the planned maximum);
 * - the guest's view through its agent: two cheap calls per scrape (GetGuestFacts, GuestStats),
 *   each timed into the agent round-trip histogram, giving the guest's memory (MemTotal and what
 *   its /proc/meminfo says is used and available), CPU seconds and processes;
 * - the pod's containers by state.
 *
 * Every sample carries `sandbox_id`, `namespace` and `handler`. A part that cannot be read (the
 * VM stopped, the agent not answering) leaves its samples out and counts a failure; the scrape
 * itself always answers.
 */
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import { errorMessage } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { packageVersion } from '../common/paths.js';
import type { ContainerRecord } from '../runtime/container/record.js';
import type { SandboxRecord } from '../runtime/sandbox/record.js';
import type { LiveSandbox } from '../runtime/sandbox/types.js';
import { EXPOSITION_CONTENT_TYPE, formatExposition, type MetricFamily, type Sample } from './exposition.js';
import { type ProcessUsage, readProcessUsage } from './proc-usage.js';

/** Upper bounds (seconds) of the agent round-trip histogram: a warm call takes a millisecond, one under TCG tens. */
export const AGENT_RPC_BUCKETS_SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

/** How long the agent calls of a scrape may take (they run side by side; a scraper's own timeout is 10 s by default). */
const AGENT_CALL_MS = 5_000;

/** What the collector reads of the pod: its sandbox (record, agent) and its containers. */
export interface PodMetricsSource {
  sandboxId: string;
  namespace: string;
  /** The handler when the sandbox has no record yet (the binary's). */
  handler: string;
  findSandbox(id: string): Pick<LiveSandbox, 'record' | 'vm' | 'agent'> | undefined;
  containers(): readonly Pick<ContainerRecord, 'state'>[];
  /** /proc (tests: a fake root). */
  procRoot?: string;
  /** This shim's pid (default process.pid). */
  shimPid?: number;
}

/** A cumulative histogram (Prometheus's: bucket counts include every smaller bucket). */
class Histogram {
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(readonly bounds: readonly number[]) {
    this.counts = bounds.map(() => 0);
  }

  observe(value: number): void {
    this.sum += value;
    this.count++;
    this.bounds.forEach((b, i) => {
      if (value <= b) this.counts[i]!++;
    });
  }

  samples(labels: Record<string, string>): Sample[] {
    return [
      ...this.bounds.map((b, i) => ({ suffix: '_bucket', labels: { ...labels, le: String(b) }, value: this.counts[i]! })),
      { suffix: '_bucket', labels: { ...labels, le: '+Inf' }, value: this.count },
      { suffix: '_sum', labels, value: this.sum },
      { suffix: '_count', labels, value: this.count },
    ];
  }
}

const gauge = (name: string, help: string, samples: Sample[]): MetricFamily => ({ name, help, type: 'gauge', samples });
const counter = (name: string, help: string, samples: Sample[]): MetricFamily => ({ name, help, type: 'counter', samples });
const sample = (labels: Record<string, string>, value: number): Sample => ({ suffix: '', labels, value });

type AgentMethod = 'GetGuestFacts' | 'GuestStats';

/** The pod's metrics; keeps the agent histogram and failure counts between scrapes. */
export class PodMetrics {
  private readonly rpc = new Map<AgentMethod, Histogram>();
  private readonly failures = new Map<AgentMethod, number>();
  private scrapes = 0;

  constructor(private readonly source: PodMetricsSource) {}

  /** Time one agent call into the histogram; undefined when it failed (counted). */
  private async timed<T>(method: AgentMethod, call: () => Promise<T>): Promise<T | undefined> {
    const started = process.hrtime.bigint();
    try {
      const out = await call();
      const h = this.rpc.get(method) ?? new Histogram(AGENT_RPC_BUCKETS_SECONDS);
      this.rpc.set(method, h);
      h.observe(Number(process.hrtime.bigint() - started) / 1e9);
      return out;
    } catch {
      this.failures.set(method, (this.failures.get(method) ?? 0) + 1);
      return undefined;
    }
  }

  /** Read everything now: the families of one scrape. */
  async collect(): Promise<MetricFamily[]> {
    const began = process.hrtime.bigint();
    this.scrapes++;
    const src = this.source;
    const procRoot = src.procRoot ?? '/proc';
    const live = src.findSandbox(src.sandboxId);
    const record: SandboxRecord | undefined = live?.record;
    const base = { sandbox_id: src.sandboxId, namespace: src.namespace, handler: record?.handler ?? src.handler };
    const processes: Array<[string, ProcessUsage]> = [
      ['shim', await readProcessUsage({ pid: src.shimPid ?? process.pid, startTimeTicks: null }, procRoot)],
    ];
    if (record?.vmm != null) processes.push(['qemu', await readProcessUsage(record.vmm, procRoot)]);
    if (record?.virtiofsd != null) processes.push(['virtiofsd', await readProcessUsage(record.virtiofsd, procRoot)]);

    const guestUp = live?.agent !== undefined && live.vm !== undefined && record?.state === 'SANDBOX_READY';
    const agent = guestUp ? live.agent : undefined;
    // Both at once: a busy guest answers one no faster than the other, and the scrape waits for the slower.
    const [facts, stats] =
      agent === undefined
        ? [undefined, undefined]
        : await Promise.all([
            this.timed('GetGuestFacts', () => agent.guestFacts({ timeoutMs: AGENT_CALL_MS })),
            this.timed('GuestStats', () => agent.guestStats({ timeoutMs: AGENT_CALL_MS })),
          ]);

    const families: MetricFamily[] = [
      gauge('kata_ts_shim_info', 'The pod shim: 1, with its kata-ts version.', [sample({ ...base, version: packageVersion() }, 1)]),
      gauge(
        'kata_ts_shim_process_up',
        "1 while the pod's host process runs (the same pid and start time as recorded), else 0.",
        processes.map(([p, u]) => sample({ ...base, process: p }, u.alive ? 1 : 0)),
      ),
      counter(
        'kata_ts_shim_process_cpu_seconds_total',
        "CPU time of the pod's host processes (QEMU: the whole VM as the host sees it), from /proc/<pid>/stat.",
        processes.flatMap(([p, u]) =>
          u.alive && u.cpu !== undefined
            ? [
                sample({ ...base, process: p, mode: 'user' }, u.cpu.userSeconds),
                sample({ ...base, process: p, mode: 'system' }, u.cpu.systemSeconds),
              ]
            : [],
        ),
      ),
      gauge(
        'kata_ts_shim_process_rss_bytes',
        "Resident memory of the pod's host processes, from /proc/<pid>/smaps_rollup.",
        processes.flatMap(([p, u]) => (u.alive && u.memory !== undefined ? [sample({ ...base, process: p }, u.memory.rssBytes)] : [])),
      ),
      gauge(
        'kata_ts_shim_process_pss_bytes',
        "Proportional memory (shared pages divided among the processes mapping them) of the pod's host processes, from /proc/<pid>/smaps_rollup.",
        processes.flatMap(([p, u]) => (u.alive && u.memory !== undefined ? [sample({ ...base, process: p }, u.memory.pssBytes)] : [])),
      ),
    ];
    if (record !== undefined) {
      const mib = 1024 * 1024;
      families.push(
        gauge('kata_ts_shim_vm_vcpus', "The VM's vCPUs: online now (current) and what hot-plug may grow them to (max).", [
          sample({ ...base, bound: 'current' }, record.shape.vcpus),
          sample({ ...base, bound: 'max' }, record.shape.maxVcpus),
        ]),
        gauge('kata_ts_shim_vm_memory_bytes', "The VM's memory: now (current) and what hot-plug may grow it to (max).", [
          sample({ ...base, bound: 'current' }, record.shape.memoryMiB * mib),
          sample({ ...base, bound: 'max' }, record.shape.maxMemoryMiB * mib),
        ]),
        gauge('kata_ts_shim_sandbox_created_seconds', 'When the sandbox was created, seconds since the epoch.', [
          sample(base, Number(BigInt(record.createdAtNs) / 1_000_000n) / 1000),
        ]),
      );
    }
    const methods: AgentMethod[] = ['GetGuestFacts', 'GuestStats'];
    families.push(
      {
        name: 'kata_ts_shim_agent_rpc_duration_seconds',
        help: "Round trip of the guest agent calls the shim's scrapes make, from the call to its answer.",
        type: 'histogram',
        samples: methods.flatMap((m) => this.rpc.get(m)?.samples({ ...base, method: m }) ?? []),
      },
      counter(
        'kata_ts_shim_agent_rpc_failures_total',
        "Guest agent calls of the shim's scrapes that failed or timed out.",
        methods.map((m) => sample({ ...base, method: m }, this.failures.get(m) ?? 0)),
      ),
    );
    if (facts !== undefined || stats?.memory != null) {
      const memory: Sample[] = [];
      if (facts !== undefined) {
        memory.push(sample({ ...base, kind: 'total' }, Number(facts.memoryKib) * 1024));
        memory.push(sample({ ...base, kind: 'online' }, Number(facts.onlineMemoryKib) * 1024));
      }
      const m = stats?.memory;
      if (m != null) {
        memory.push(sample({ ...base, kind: 'used' }, Number(m.usageBytes)));
        memory.push(sample({ ...base, kind: 'available' }, Number(m.availableBytes)));
        memory.push(sample({ ...base, kind: 'working_set' }, Number(m.workingSetBytes)));
        memory.push(sample({ ...base, kind: 'anon' }, Number(m.rssBytes)));
      }
      families.push(
        gauge(
          'kata_ts_shim_guest_memory_bytes',
          "The guest's memory as its kernel tells it (/proc/meminfo): total (MemTotal), online (memory blocks online), used (total - free), available (MemAvailable), working_set (total - available), anon (AnonPages).",
          memory,
        ),
      );
    }
    if (stats !== undefined) {
      if (stats.cpu != null) {
        families.push(
          counter('kata_ts_shim_guest_cpu_seconds_total', "CPU time the guest's processes used, by the guest's root cgroup.", [
            sample(base, Number(stats.cpu.usageNs) / 1e9),
          ]),
        );
      }
      families.push(gauge('kata_ts_shim_guest_processes', 'Processes in the guest.', [sample(base, Number(stats.pids))]));
    }
    const states = new Map<string, number>();
    for (const c of src.containers()) states.set(c.state, (states.get(c.state) ?? 0) + 1);
    families.push(
      gauge(
        'kata_ts_shim_containers',
        "The pod's containers (the pause task not counted), by state.",
        ['CONTAINER_CREATED', 'CONTAINER_RUNNING', 'CONTAINER_EXITED'].map((s) =>
          sample({ ...base, state: s.slice('CONTAINER_'.length).toLowerCase() }, states.get(s) ?? 0),
        ),
      ),
      counter('kata_ts_shim_scrapes_total', 'Scrapes this shim answered.', [sample(base, this.scrapes)]),
      gauge('kata_ts_shim_scrape_duration_seconds', 'How long this scrape took to read everything.', [
        sample(base, Number(process.hrtime.bigint() - began) / 1e9),
      ]),
    );
    return families;
  }
}

/** A listening metrics socket. */
export interface MetricsEndpoint {
  socketPath: string;
  /** Stop listening and remove the socket (idempotent). */
  close(): Promise<void>;
}

/** Serve `GET /metrics` from `metrics` over HTTP on the unix socket `socketPath` (0600; a stale file is replaced). */
export async function serveMetricsSocket(socketPath: string, metrics: PodMetrics, logger: Logger): Promise<MetricsEndpoint> {
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('only GET /metrics is served here\n');
      return;
    }
    metrics.collect().then(
      (families) => res.writeHead(200, { 'content-type': EXPOSITION_CONTENT_TYPE }).end(formatExposition(families)),
      (err: unknown) => {
        logger.error({ err: errorMessage(err) }, 'metrics collection failed');
        res.writeHead(500, { 'content-type': 'text/plain' }).end('metrics collection failed\n');
      },
    );
  });
  // The pod's state dir is held by this shim (its lock): a file here is a dead shim's socket.
  await fsp.rm(socketPath, { force: true });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => {
      server.off('error', reject);
      resolve();
    });
  });
  await fsp.chmod(socketPath, 0o600);
  let closing: Promise<void> | undefined;
  return {
    socketPath,
    close: () => {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        // A scraper's keep-alive connection must not hold the shim's exit.
        server.closeAllConnections();
      }).then(() => fsp.rm(socketPath, { force: true }));
      return closing;
    },
  };
}
