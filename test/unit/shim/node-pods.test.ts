/**
 * `kata-ts ps`'s reading of a node (src/shim/node-pods.ts) and its view and table (src/cli/ps.ts),
 * on a state root and a /proc root the test writes: a running pod, a pod whose VM pid was reused,
 * a dead shim, a pod half written, a pod whose files do not parse; the standalone daemon's pods
 * and its pooled VMs. Reading changes nothing on disk (an older record format stays as it was written).
 */
import { promises as fsp, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { formatDuration, formatPsTable, podView, pooledVmView } from '../../../src/cli/ps.js';
import { packageRoot } from '../../../src/common/paths.js';
import { POOLED_VM_RECORD_KIND } from '../../../src/runtime/pool/record.js';
import { readPooledVms, readShimPods, readStandalonePods } from '../../../src/shim/node-pods.js';
import { parseProcCpu, parseSmapsRollup, readProcessUsage } from '../../../src/shim/proc-usage.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
function tmp(): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-node-pods-'));
  dirs.push(d);
  return d;
}

const FIXTURE = path.join(packageRoot(), 'fixtures', 'records', 'v5', 'sandboxes', `${'a1'.repeat(32)}.json`);
const ID = 'a1'.repeat(32);
const QEMU_PID = 4194000;
const SHIM_PID = 4194100;

/** A /proc/<pid>/stat line: utime and stime in ticks, the start time in ticks. */
function statLine(pid: number, comm: string, state: string, utime: number, stime: number, start: number): string {
  // Fields 3..22: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime prio nice threads itreal starttime.
  return `${pid} (${comm}) ${state} 1 1 1 0 -1 0 0 0 0 0 ${utime} ${stime} 0 0 20 0 1 0 ${start} 1000 10 0\n`;
}

async function writeProc(procRoot: string, pid: number, files: Record<string, string>): Promise<void> {
  await fsp.mkdir(path.join(procRoot, String(pid)), { recursive: true });
  for (const [name, text] of Object.entries(files)) await fsp.writeFile(path.join(procRoot, String(pid), name), text);
}

/** The v5 fixture record made a running pod (envelope kept at format 5: read-only migration). */
async function runningRecord(): Promise<string> {
  const envelope = JSON.parse(readFileSync(FIXTURE, 'utf8')) as { record: Record<string, unknown> };
  Object.assign(envelope.record, {
    phase: 'running',
    state: 'SANDBOX_READY',
    createdAtNs: String(BigInt(Date.UTC(2026, 0, 1)) * 1_000_000n),
    vmm: { ...(envelope.record.vmm as object), pid: QEMU_PID, startTimeTicks: 123456 },
    placement: {
      driver: 'cgroupfs',
      cgroupParent: '/kubepods/burstable/podu1',
      mode: 'hybrid',
      paths: {
        memory: '/sys/fs/cgroup/memory/kubepods/burstable/podu1/kata-ts-a1',
        cpu: '/sys/fs/cgroup/cpu/kubepods/burstable/podu1/kata-ts-a1',
      },
      limits: { cpuQuotaMillicores: 2000, cpuRequestMillicores: 100, memoryLimitBytes: 1 << 30 },
    },
  });
  return `${JSON.stringify(envelope, null, 2)}\n`;
}

async function writePod(
  stateDir: string,
  opts: { shimJson?: string; record?: string; containers?: number; socket?: boolean },
): Promise<void> {
  await fsp.mkdir(path.join(stateDir, 'sandboxes'), { recursive: true });
  if (opts.shimJson !== undefined) await fsp.writeFile(path.join(stateDir, 'shim.json'), opts.shimJson);
  if (opts.record !== undefined) await fsp.writeFile(path.join(stateDir, 'sandboxes', `${ID}.json`), opts.record);
  await fsp.mkdir(path.join(stateDir, 'containers'), { recursive: true });
  for (let i = 0; i < (opts.containers ?? 0); i++) await fsp.writeFile(path.join(stateDir, 'containers', `c${i}.json`), '{}');
  if (opts.socket === true) await fsp.writeFile(path.join(stateDir, 'metrics.sock'), '');
}

const shimJson = (pid: number) =>
  JSON.stringify({
    pid,
    sandboxId: ID,
    namespace: 'k8s.io',
    bundle: '/run/containerd/io.containerd.runtime.v2.task/k8s.io/x',
    socket: '/run/kata-ts/shim/s/abc',
    cgroupDriver: 'cgroupfs',
    startedAt: '2026-01-01T00:00:00.000Z',
  });

describe('reading /proc', () => {
  it('CPU seconds from utime + stime, memory from smaps_rollup; a reused pid is not our process', async () => {
    expect(parseProcCpu(statLine(7, 'a) R 1 (b', 'S', 250, 50, 99))).toEqual({
      startTimeTicks: 99,
      state: 'S',
      userSeconds: 2.5,
      systemSeconds: 0.5,
    });
    expect(parseProcCpu('garbage')).toBeUndefined();
    expect(parseSmapsRollup('Rss:  2048 kB\nPss:  1024 kB\nPss_Anon: 3 kB\n')).toEqual({ rssBytes: 2048 * 1024, pssBytes: 1024 * 1024 });
    expect(parseSmapsRollup('Rss: 1 kB\n')).toBeUndefined();
    const proc = path.join(tmp(), 'proc');
    await writeProc(proc, 9, { stat: statLine(9, 'qemu', 'S', 10, 10, 500), smaps_rollup: 'Rss: 4 kB\nPss: 2 kB\n' });
    expect(await readProcessUsage({ pid: 9, startTimeTicks: 500 }, proc)).toMatchObject({
      alive: true,
      memory: { rssBytes: 4096, pssBytes: 2048 },
    });
    expect((await readProcessUsage({ pid: 9, startTimeTicks: 501 }, proc)).alive).toBe(false);
    expect((await readProcessUsage({ pid: 10, startTimeTicks: 500 }, proc)).alive).toBe(false);
    await writeProc(proc, 11, { stat: statLine(11, 'qemu', 'Z', 10, 10, 500) });
    expect((await readProcessUsage({ pid: 11, startTimeTicks: 500 }, proc)).alive).toBe(false);
  });
});

describe('kata-ts ps', () => {
  it('lists a running pod: live shim and VM, the recorded shape, cgroup, containers, metrics socket; the record file untouched', async () => {
    const root = tmp();
    const stateRoot = path.join(root, 'shim');
    const proc = path.join(root, 'proc');
    const stateDir = path.join(stateRoot, 'k8s.io', ID.slice(0, 16));
    await writePod(stateDir, { shimJson: shimJson(SHIM_PID), record: await runningRecord(), containers: 2, socket: true });
    await fsp.mkdir(path.join(stateRoot, 's'), { recursive: true });
    await writeProc(proc, QEMU_PID, {
      stat: statLine(QEMU_PID, 'qemu-system-x86', 'S', 100, 20, 123456),
      smaps_rollup: 'Rss: 10 kB\nPss: 8 kB\n',
    });
    await writeProc(proc, SHIM_PID, { cmdline: ['node', 'shim', '-id', ID, 'serve', ''].join('\0') });
    const recordFile = path.join(stateDir, 'sandboxes', `${ID}.json`);
    const before = readFileSync(recordFile, 'utf8');

    const states = await readShimPods(stateRoot, { procRoot: proc });
    expect(readFileSync(recordFile, 'utf8')).toBe(before);
    expect(states).toHaveLength(1);
    const view = podView(states[0]!, Date.UTC(2026, 0, 1, 1, 2, 3));
    expect(view).toMatchObject({
      source: 'shim',
      namespace: 'k8s.io',
      sandboxId: ID,
      pod: 'shop/web',
      handler: 'kata-ts',
      status: 'running',
      shim: { pid: SHIM_PID, alive: true },
      vm: { pid: QEMU_PID, startTimeTicks: 123456, alive: true },
      shape: { vcpus: 2, maxVcpus: 6, memoryMiB: 800, maxMemoryMiB: 4896 },
      createdAt: '2026-01-01T00:00:00.000Z',
      uptimeSeconds: 3723,
      cgroup: { driver: 'cgroupfs', path: '/sys/fs/cgroup/cpu/kubepods/burstable/podu1/kata-ts-a1', unit: null },
      containers: 2,
      metricsSocket: path.join(stateDir, 'metrics.sock'),
      problems: [],
    });
    const table = formatPsTable([view]).split('\n');
    expect(table[0]).toMatch(
      /^NAMESPACE\s+SANDBOX\s+POD\s+HANDLER\s+STATUS\s+SHIM\s+VM\s+VCPUS\s+MEMORY\s+UPTIME\s+CTRS\s+CGROUP\s+METRICS$/,
    );
    expect(table[1]).toMatch(
      new RegExp(
        `^k8s\\.io\\s+${ID.slice(0, 13)}\\s+shop/web\\s+kata-ts\\s+running\\s+${SHIM_PID}\\s+${QEMU_PID}\\s+2/6\\s+800/4896MiB\\s+1h2m\\s+2\\s+/sys/fs/cgroup/cpu/\\S+\\s+\\S+metrics\\.sock$`,
      ),
    );
  });

  it('a dead shim, a reused VM pid, a half-written pod and files that do not parse are listed as such', async () => {
    const root = tmp();
    const stateRoot = path.join(root, 'shim');
    const proc = path.join(root, 'proc');
    const dir = (name: string, ns = 'k8s.io') => path.join(stateRoot, ns, name);
    // QEMU's pid now belongs to another process (another start time); the shim runs.
    await writePod(dir('a-vm-gone'), { shimJson: shimJson(SHIM_PID), record: await runningRecord() });
    await writeProc(proc, QEMU_PID, { stat: statLine(QEMU_PID, 'bash', 'S', 1, 1, 999) });
    await writeProc(proc, SHIM_PID, { cmdline: ['node', 'shim', '-id', ID, 'serve', ''].join('\0') });
    // The shim's pid runs something else.
    await writePod(dir('b-shim-gone'), { shimJson: shimJson(SHIM_PID + 1), record: await runningRecord() });
    await writeProc(proc, SHIM_PID + 1, { cmdline: 'sleep\u00001000\u0000' });
    // Starting: no shim.json, no record yet.
    await writePod(dir('c-starting', 'other'), {});
    // shim.json and the record are not what they should be.
    await writePod(dir('d-broken'), { shimJson: '{"pid": 1', record: '{' });
    await writePod(dir('e-bad-record'), { shimJson: shimJson(SHIM_PID), record: '{"kind":"sandbox","version":6,"record":{"id":"x"}}' });
    await fsp.writeFile(path.join(stateRoot, 'cleanup.log'), 'a file beside the namespaces\n');

    const views = (await readShimPods(stateRoot, { procRoot: proc })).map((s) => podView(s, Date.now()));
    const by = (name: string) => views.find((v) => v.stateDir.endsWith(name))!;
    expect(views).toHaveLength(5);
    expect(by('a-vm-gone')).toMatchObject({ status: 'vm-gone', vm: { pid: QEMU_PID, alive: false }, shim: { alive: true } });
    expect(by('b-shim-gone')).toMatchObject({ status: 'shim-gone', shim: { pid: SHIM_PID + 1, alive: false } });
    expect(by('c-starting')).toMatchObject({ status: 'starting', namespace: 'other', sandboxId: null, shape: null });
    expect(by('c-starting').problems).toEqual([expect.stringMatching(/^no shim\.json/)]);
    expect(by('d-broken').status).toBe('unreadable');
    expect(by('d-broken').problems).toEqual([
      expect.stringMatching(/shim\.json is not JSON/),
      expect.stringMatching(/is not JSON \(being written\?\)/),
    ]);
    expect(by('e-bad-record')).toMatchObject({ status: 'unreadable', sandboxId: ID });
    expect(by('e-bad-record').problems).toEqual([expect.stringMatching(/is not a valid sandbox record/)]);
    const table = formatPsTable(views);
    expect(table).toMatch(/vm-gone\s+\d+\s+4194000\(dead\)/);
    expect(table).toContain('    ! no shim.json');
    // Nothing under the state root: an empty listing (header only), a missing root too.
    expect(formatPsTable((await readShimPods(path.join(root, 'none'))).map((s) => podView(s, 0)))).toMatch(/^NAMESPACE.*\n$/);
  });

  it("node mode: the pod is alive while its relay runs, whatever the node server's pid does; a relay gone is shim-gone", async () => {
    const root = tmp();
    const stateRoot = path.join(root, 'shim');
    const proc = path.join(root, 'proc');
    const RELAY_PID = 4194200;
    const nodeShimJson = (stateDir: string, socket: string) =>
      JSON.stringify({
        ...(JSON.parse(shimJson(SHIM_PID)) as object),
        socket,
        node: {
          containerdAddress: '/run/containerd/containerd.sock',
          upstream: path.join(stateDir, 'upstream.sock'),
          relayPidFile: path.join(stateDir, 'relay.pid'),
        },
      });
    const relayCmdline = (socket: string) =>
      ['/opt/kata-ts/dist/native/kata-ts-shim-relay', '--listen', socket, '--upstream', 'u', '--', 'node-serve', ''].join('\0');
    // The node server (shim.json's pid) is down (a relay is reviving it): its pid runs nothing; the relay runs.
    const alive = path.join(stateRoot, 'k8s.io', 'a-alive');
    await writePod(alive, { shimJson: nodeShimJson(alive, '/run/kata-ts/shim/s/a'), record: await runningRecord() });
    await fsp.writeFile(path.join(alive, 'relay.pid'), `${RELAY_PID}\n`);
    await writeProc(proc, RELAY_PID, { cmdline: relayCmdline('/run/kata-ts/shim/s/a') });
    await writeProc(proc, QEMU_PID, { stat: statLine(QEMU_PID, 'qemu-system-x86', 'S', 1, 1, 123456) });
    // The relay's pid file names a relay of another pod's socket, and another names a reused pid: gone.
    const other = path.join(stateRoot, 'k8s.io', 'b-other-socket');
    await writePod(other, { shimJson: nodeShimJson(other, '/run/kata-ts/shim/s/b'), record: await runningRecord() });
    await fsp.writeFile(path.join(other, 'relay.pid'), `${RELAY_PID}\n`);
    const reused = path.join(stateRoot, 'k8s.io', 'c-reused');
    await writePod(reused, { shimJson: nodeShimJson(reused, '/run/kata-ts/shim/s/c'), record: await runningRecord() });
    await fsp.writeFile(path.join(reused, 'relay.pid'), `${RELAY_PID + 1}\n`);
    await writeProc(proc, RELAY_PID + 1, { cmdline: 'sleep\u00001000\u0000' });

    const views = (await readShimPods(stateRoot, { procRoot: proc })).map((s) => podView(s, Date.now()));
    const by = (name: string) => views.find((v) => v.stateDir.endsWith(name))!;
    expect(by('a-alive')).toMatchObject({ status: 'running', shim: { pid: SHIM_PID, alive: true, mode: 'node', relayPid: RELAY_PID } });
    expect(by('b-other-socket')).toMatchObject({ status: 'shim-gone', shim: { alive: false, mode: 'node', relayPid: null } });
    expect(by('c-reused')).toMatchObject({ status: 'shim-gone', shim: { alive: false, mode: 'node', relayPid: null } });
    const table = formatPsTable(views);
    expect(table).toMatch(new RegExp(`running\\s+relay:${RELAY_PID}\\s+${QEMU_PID}\\s`));
    expect(table).toMatch(/shim-gone\s+relay\(dead\)/);
  });

  it("--standalone: the daemon's sandbox records, their containers counted by sandbox", async () => {
    const stateDir = tmp();
    await fsp.mkdir(path.join(stateDir, 'sandboxes'), { recursive: true });
    await fsp.mkdir(path.join(stateDir, 'containers'), { recursive: true });
    await fsp.writeFile(path.join(stateDir, 'sandboxes', `${ID}.json`), await runningRecord());
    const container = (sandboxId: string) => JSON.stringify({ kind: 'container', version: 1, record: { sandboxId } });
    await fsp.writeFile(path.join(stateDir, 'containers', 'c1.json'), container(ID));
    await fsp.writeFile(path.join(stateDir, 'containers', 'c2.json'), container('other'));
    const [view, ...rest] = (await readStandalonePods(stateDir, { procRoot: path.join(stateDir, 'noproc') })).map((s) =>
      podView(s, Date.now()),
    );
    expect(rest).toEqual([]);
    expect(view).toMatchObject({ source: 'standalone', namespace: 'shop', sandboxId: ID, status: 'vm-gone', containers: 1, shim: null });
    expect(formatPsTable([view!])).toMatch(/shop\s+a1a1a1a1a1a1a\s+shop\/web\s+kata-ts\s+vm-gone\s+daemon/);
  });

  it("--standalone: the daemon's pooled VMs, ready, booting or gone, with a cgroup when the record has one; a bad record does not stop the listing", async () => {
    const stateDir = tmp();
    const proc = path.join(stateDir, 'proc');
    const poolDir = path.join(stateDir, 'pool');
    await fsp.mkdir(poolDir, { recursive: true });
    const created = Date.UTC(2026, 0, 1);
    const pooledRecord = (id: string, phase: 'booting' | 'ready', vmm: { pid: number; startTimeTicks: number } | null, extra = {}) => ({
      kind: 'pooled-vm',
      version: POOLED_VM_RECORD_KIND.version,
      record: {
        id,
        phase,
        handler: 'kata-ts',
        key: { handler: 'kata-ts' },
        shape: { vcpus: 1, maxVcpus: 2, memoryMiB: 256, maxMemoryMiB: 24064 },
        createdAtNs: String(BigInt(created) * 1_000_000n),
        workDir: path.join(stateDir, 'pool-vm', id.slice(0, 16)),
        network: null,
        confinement: null,
        vmm:
          vmm === null
            ? null
            : {
                ...vmm,
                qmpSocket: 'q',
                readySocket: 'r',
                consoleLog: 'c',
                qemuLog: 'l',
                agentSocket: 'a',
                qemuVirtiofsSocket: 'v',
              },
        guest: null,
        bootMs: null,
        bootCpuMs: null,
        placement: null,
        ...extra,
      },
    });
    const write = (name: string, doc: unknown) =>
      fsp.writeFile(path.join(poolDir, name), typeof doc === 'string' ? doc : JSON.stringify(doc));
    const [ready, booting, gone, half] = ['b1', 'b2', 'b3', 'b4'].map((h) => h.repeat(32)) as [string, string, string, string];
    // Ready and alive, its QEMU in the pool's cgroup.
    await write(
      `${ready}.json`,
      pooledRecord(
        ready,
        'ready',
        { pid: QEMU_PID, startTimeTicks: 555 },
        {
          placement: {
            driver: 'cgroupfs',
            cgroupParent: '/kata-ts-pool',
            mode: 'hybrid',
            paths: { cpu: '/sys/fs/cgroup/cpu/kata-ts-pool', memory: '/sys/fs/cgroup/memory/kata-ts-pool' },
            limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 2, memoryLimitBytes: 0 },
          },
        },
      ),
    );
    await writeProc(proc, QEMU_PID, { stat: statLine(QEMU_PID, 'qemu-system-x86', 'S', 1, 1, 555) });
    // Booting: QEMU runs, the agent has not answered yet.
    await write(`${booting}.json`, pooledRecord(booting, 'booting', { pid: QEMU_PID + 1, startTimeTicks: 556 }));
    await writeProc(proc, QEMU_PID + 1, { stat: statLine(QEMU_PID + 1, 'qemu-system-x86', 'R', 1, 1, 556) });
    // Ready, but its pid now belongs to another process.
    await write(`${gone}.json`, pooledRecord(gone, 'ready', { pid: QEMU_PID + 2, startTimeTicks: 557 }));
    await writeProc(proc, QEMU_PID + 2, { stat: statLine(QEMU_PID + 2, 'bash', 'S', 1, 1, 9999) });
    // Recorded before QEMU started.
    await write(`${half}.json`, pooledRecord(half, 'booting', null));
    // Being written, and a record of a format from the future.
    await write(`${'b5'.repeat(32)}.json`, '{"kind":"pooled-vm"');
    await write(`${'b6'.repeat(32)}.json`, { kind: 'pooled-vm', version: 99, record: {} });
    const files = await fsp.readdir(poolDir);
    const before = await Promise.all(files.map((f) => fsp.readFile(path.join(poolDir, f), 'utf8')));

    const views = (await readPooledVms(stateDir, { procRoot: proc })).map((s) => pooledVmView(s, created + 65_000));
    expect(await Promise.all(files.map((f) => fsp.readFile(path.join(poolDir, f), 'utf8')))).toEqual(before);
    expect(views).toHaveLength(6);
    const by = (id: string) => views.find((v) => v.poolVmId === id)!;
    expect(by(ready)).toMatchObject({
      source: 'pool',
      sandboxId: null,
      pod: null,
      handler: 'kata-ts',
      status: 'pooled',
      vm: { pid: QEMU_PID, startTimeTicks: 555, alive: true },
      shape: { vcpus: 1, maxVcpus: 2, memoryMiB: 256, maxMemoryMiB: 24064 },
      uptimeSeconds: 65,
      cgroup: { driver: 'cgroupfs', path: '/sys/fs/cgroup/cpu/kata-ts-pool', unit: null },
      containers: 0,
      problems: [],
    });
    expect(by(booting)).toMatchObject({ status: 'booting', vm: { pid: QEMU_PID + 1, alive: true }, cgroup: null });
    expect(by(gone)).toMatchObject({ status: 'vm-gone', vm: { pid: QEMU_PID + 2, alive: false } });
    expect(by(half)).toMatchObject({ status: 'booting', vm: null });
    const unreadable = views.filter((v) => v.status === 'unreadable');
    expect(unreadable.map((v) => v.problems)).toEqual([
      [expect.stringMatching(/is not JSON \(being written\?\)/)],
      [expect.stringMatching(new RegExp(`has format 99; this kata-ts reads ${POOLED_VM_RECORD_KIND.version}`))],
    ]);
    const table = formatPsTable(views);
    expect(table).toMatch(
      new RegExp(
        `^-\\s+-\\s+pool:${ready.slice(0, 13)}\\s+kata-ts\\s+pooled\\s+daemon\\s+${QEMU_PID}\\s+1/2\\s+256/24064MiB\\s+1m5s\\s+0\\s+/sys/fs/cgroup/cpu/kata-ts-pool\\s+-$`,
        'm',
      ),
    );
    expect(table).toMatch(new RegExp(`pool:${gone.slice(0, 13)}\\s+kata-ts\\s+vm-gone\\s+daemon\\s+${QEMU_PID + 2}\\(dead\\)`));
    expect(table).toMatch(/pool:\?\s+-\s+unreadable/);
    // Under the systemd driver the pool's cgroup is a scope in the pool's slice.
    const [scoped] = (await readPooledVms(stateDir, { procRoot: proc })).filter((s) => s.record?.id === ready);
    const systemdPlacement = { ...scoped!.record!.placement!, driver: 'systemd' as const, unit: 'kata-ts-pool.scope', slice: 'kata.slice' };
    expect(pooledVmView({ ...scoped!, record: { ...scoped!.record!, placement: systemdPlacement } }, created).cgroup).toMatchObject({
      driver: 'systemd',
      path: 'kata.slice/kata-ts-pool.scope',
    });
    // No pool dir at all: nothing pooled.
    expect(await readPooledVms(path.join(stateDir, 'none'))).toEqual([]);
  });

  it('formats durations', () => {
    expect([7, 66, 3723, 90_061].map(formatDuration)).toEqual(['7s', '1m6s', '1h2m', '1d1h']);
  });
});
