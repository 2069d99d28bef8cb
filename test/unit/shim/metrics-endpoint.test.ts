/**
 * A pod shim's metrics socket (src/shim/metrics-endpoint.ts) on a /proc root the test writes and
 * an agent the test answers for (the real agent is scraped in test/integration/shim/day-two.test.ts):
 * what one scrape holds, labels on every sample, the agent histogram across scrapes, a failing
 * agent counted and left out, 404 for other paths, the socket removed on close.
 */
import { existsSync, promises as fsp, mkdtempSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { EXPOSITION_CONTENT_TYPE, type MetricFamily, parseExposition } from '../../../src/shim/exposition.js';
import { PodMetrics, type PodMetricsSource, serveMetricsSocket } from '../../../src/shim/metrics-endpoint.js';
import { scrapeMetricsSocket } from '../../../src/shim/node-pods.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const stat = (pid: number, utime: number, stime: number, start: number) =>
  `${pid} (x) S 1 1 1 0 -1 0 0 0 0 0 ${utime} ${stime} 0 0 20 0 1 0 ${start} 1 1\n`;

async function fixture(agentFails = false): Promise<{ dir: string; source: PodMetricsSource }> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-metrics-'));
  dirs.push(dir);
  const proc = path.join(dir, 'proc');
  for (const [pid, start] of [
    [10, 100],
    [20, 200],
    [30, 300],
  ] as const) {
    await fsp.mkdir(path.join(proc, String(pid)), { recursive: true });
    await fsp.writeFile(path.join(proc, String(pid), 'stat'), stat(pid, pid * 10, pid, start));
    await fsp.writeFile(path.join(proc, String(pid), 'smaps_rollup'), `Rss: ${pid} kB\nPss: ${pid / 2} kB\n`);
  }
  const agent = {
    guestFacts: async () => {
      if (agentFails) throw new Error('agent gone');
      return { memoryKib: 2048, onlineMemoryKib: 4096 };
    },
    guestStats: async () => {
      if (agentFails) throw new Error('agent gone');
      return {
        takenAt: null,
        cpu: { usageNs: 3_000_000_000, userNs: 0, systemNs: 0 },
        memory: {
          usageBytes: 100,
          availableBytes: 900,
          workingSetBytes: 200,
          rssBytes: 50,
          pageFaults: 0,
          majorPageFaults: 0,
          oomKills: 0,
        },
        pids: 7,
      };
    },
  };
  const record = {
    id: 'sb1',
    handler: 'kata-ts',
    state: 'SANDBOX_READY',
    createdAtNs: '1700000000123000000',
    shape: { vcpus: 1, maxVcpus: 4, memoryMiB: 512, maxMemoryMiB: 2048 },
    vmm: { pid: 20, startTimeTicks: 200 },
    // virtiofsd's pid now runs another process (another start time).
    virtiofsd: { pid: 30, startTimeTicks: 301 },
  };
  const source: PodMetricsSource = {
    sandboxId: 'sb1',
    namespace: 'k8s.io',
    handler: 'from-binary',
    findSandbox: (id) => (id === 'sb1' ? ({ record, vm: {}, agent } as never) : undefined),
    containers: () => [{ state: 'CONTAINER_RUNNING' }, { state: 'CONTAINER_EXITED' }, { state: 'CONTAINER_RUNNING' }],
    procRoot: proc,
    shimPid: 10,
  };
  return { dir, source };
}

const value = (families: MetricFamily[], name: string, labels: Record<string, string>, suffix = '') =>
  families
    .find((f) => f.name === name)
    ?.samples.find((s) => s.suffix === suffix && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;

describe('the pod metrics socket', () => {
  it('one scrape: processes (up, CPU, RSS, PSS), shape, agent round trip, guest memory, containers, all labelled with the pod', async () => {
    const { dir, source } = await fixture();
    const socket = path.join(dir, 'metrics.sock');
    await fsp.writeFile(socket, 'left by a dead shim');
    const endpoint = await serveMetricsSocket(socket, new PodMetrics(source), silentLogger());
    try {
      expect(statSync(socket).isSocket()).toBe(true);
      expect(statSync(socket).mode & 0o777).toBe(0o600);
      const families = parseExposition(await scrapeMetricsSocket(socket, 5_000));
      for (const f of families) {
        for (const s of f.samples) expect(s.labels, f.name).toMatchObject({ sandbox_id: 'sb1', namespace: 'k8s.io', handler: 'kata-ts' });
      }
      const cpu = 'kata_ts_shim_process_cpu_seconds_total';
      expect(value(families, cpu, { process: 'qemu', mode: 'user' })).toBe(2);
      expect(value(families, cpu, { process: 'qemu', mode: 'system' })).toBe(0.2);
      expect(value(families, cpu, { process: 'shim', mode: 'user' })).toBe(1);
      expect(value(families, cpu, { process: 'virtiofsd', mode: 'user' })).toBeUndefined();
      expect(value(families, 'kata_ts_shim_process_up', { process: 'qemu' })).toBe(1);
      expect(value(families, 'kata_ts_shim_process_up', { process: 'virtiofsd' })).toBe(0);
      expect(value(families, 'kata_ts_shim_process_rss_bytes', { process: 'qemu' })).toBe(20 * 1024);
      expect(value(families, 'kata_ts_shim_process_pss_bytes', { process: 'qemu' })).toBe(10 * 1024);
      expect(value(families, 'kata_ts_shim_vm_vcpus', { bound: 'max' })).toBe(4);
      expect(value(families, 'kata_ts_shim_vm_memory_bytes', { bound: 'current' })).toBe(512 * 1024 * 1024);
      expect(value(families, 'kata_ts_shim_sandbox_created_seconds', {})).toBe(1700000000.123);
      expect(value(families, 'kata_ts_shim_guest_memory_bytes', { kind: 'total' })).toBe(2048 * 1024);
      expect(value(families, 'kata_ts_shim_guest_memory_bytes', { kind: 'available' })).toBe(900);
      expect(value(families, 'kata_ts_shim_guest_cpu_seconds_total', {})).toBe(3);
      expect(value(families, 'kata_ts_shim_guest_processes', {})).toBe(7);
      expect(value(families, 'kata_ts_shim_containers', { state: 'running' })).toBe(2);
      expect(value(families, 'kata_ts_shim_containers', { state: 'created' })).toBe(0);
      const rpc = 'kata_ts_shim_agent_rpc_duration_seconds';
      expect(value(families, rpc, { method: 'GuestStats' }, '_count')).toBe(1);
      // The histogram accumulates across scrapes.
      const again = parseExposition(await scrapeMetricsSocket(socket, 5_000));
      expect(value(again, rpc, { method: 'GuestStats' }, '_count')).toBe(2);
      expect(value(again, rpc, { method: 'GuestStats', le: '+Inf' }, '_bucket')).toBe(2);
      expect(value(again, 'kata_ts_shim_scrapes_total', {})).toBe(2);
      // Only GET /metrics.
      const status = await new Promise<number | undefined>((resolve, reject) =>
        http
          .get({ socketPath: socket, path: '/other', agent: false }, (res) => {
            res.resume();
            resolve(res.statusCode);
          })
          .on('error', reject),
      );
      expect(status).toBe(404);
      const type = await new Promise<string | undefined>((resolve, reject) =>
        http
          .get({ socketPath: socket, path: '/metrics', agent: false }, (res) => {
            res.resume();
            resolve(res.headers['content-type']);
          })
          .on('error', reject),
      );
      expect(type).toBe(EXPOSITION_CONTENT_TYPE);
    } finally {
      await endpoint.close();
    }
    expect(existsSync(socket)).toBe(false);
    await endpoint.close();
  });

  it('an agent that fails: its samples left out, the failures counted, the scrape still answered', async () => {
    const { source } = await fixture(true);
    const metrics = new PodMetrics(source);
    await metrics.collect();
    const families = await metrics.collect();
    expect(value(families, 'kata_ts_shim_agent_rpc_failures_total', { method: 'GetGuestFacts' })).toBe(2);
    expect(families.find((f) => f.name === 'kata_ts_shim_guest_memory_bytes')).toBeUndefined();
    expect(families.find((f) => f.name === 'kata_ts_shim_agent_rpc_duration_seconds')?.samples).toEqual([]);
    // No sandbox (not created yet): the binary's handler, only the shim's own process.
    const empty = await new PodMetrics({ ...source, findSandbox: () => undefined }).collect();
    expect(value(empty, 'kata_ts_shim_process_up', { process: 'shim', handler: 'from-binary' })).toBe(1);
    expect(value(empty, 'kata_ts_shim_process_up', { process: 'qemu' })).toBeUndefined();
  });
});
