/**
 * Runs INSIDE the confined namespaces (started by inner.sh): drives the systemd cgroup driver
 * against the real user manager and records what it observes - through independent clients
 * (systemctl, systemd-run) and the cgroup files - as JSON in $KATA_TS_RESULT. The outer vitest
 * test (test/integration/cgroups/systemd.test.ts) asserts on it. Nothing here asserts, so that
 * every observation reaches the outer test even when one step misbehaves.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import {
  type CgroupDriver,
  createCgroupDriver,
  type PlacementRecord,
  probeSystemdManager,
  type VmmLimits,
} from '../../../src/cgroups/index.js';
import { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';

const run = promisify(execFile);
const address = process.env.DBUS_SESSION_BUS_ADDRESS as string;
const logger = silentLogger();
const out: Record<string, unknown> = {};
const children: ChildProcess[] = [];

function errorShape(err: unknown): { kind?: string; reason?: string; message: string; details?: unknown } {
  if (err instanceof KataError) return { kind: err.kind, reason: err.reason, message: err.message, details: err.details };
  return { message: String(err) };
}

async function attempt<T>(fn: () => Promise<T>): Promise<{ ok: true; value: T } | { ok: false; error: ReturnType<typeof errorShape> }> {
  try {
    return { ok: true, value: await fn() };
  } catch (err) {
    return { ok: false, error: errorShape(err) };
  }
}

function startSleep(): ChildProcess {
  const child = spawn('sleep', ['300'], { stdio: 'ignore' });
  children.push(child);
  return child;
}

async function killAndWait(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  process.kill(child.pid as number, 'SIGKILL');
  await exited;
}

async function show(unit: string, props: string[]): Promise<Record<string, string>> {
  const { stdout } = await run('systemctl', ['--user', 'show', unit, ...props.map((p) => `--property=${p}`)]);
  return Object.fromEntries(
    stdout
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
}

async function readOr(file: string): Promise<string | null> {
  return fsp.readFile(file, 'utf8').then(
    (t) => t.trim(),
    () => null,
  );
}

/** The limit files of the scope, read from the hierarchies the user manager realises. */
async function limitFiles(controlGroup: string): Promise<Record<string, string | null>> {
  const base = '/sys/fs/cgroup';
  return {
    'cpu.cfs_quota_us': await readOr(path.join(base, 'cpu', controlGroup, 'cpu.cfs_quota_us')),
    'cpu.cfs_period_us': await readOr(path.join(base, 'cpu', controlGroup, 'cpu.cfs_period_us')),
    'cpu.shares': await readOr(path.join(base, 'cpu', controlGroup, 'cpu.shares')),
    'memory.limit_in_bytes': await readOr(path.join(base, 'memory', controlGroup, 'memory.limit_in_bytes')),
    'pids.current': await readOr(path.join(base, 'pids', controlGroup, 'pids.current')),
    'pids.max': await readOr(path.join(base, 'pids', controlGroup, 'pids.max')),
  };
}

const UNIT_PROPS = [
  'LoadState',
  'ActiveState',
  'ControlGroup',
  'Slice',
  'Delegate',
  'Description',
  'DefaultDependencies',
  'CPUAccounting',
  'MemoryAccounting',
  'TasksAccounting',
  'MemoryLimit',
  'MemoryMax',
  'CPUShares',
  'CPUWeight',
  'CPUQuotaPerSecUSec',
  'TasksMax',
];

async function observePlacement(driver: CgroupDriver, record: PlacementRecord, pid: number) {
  const unit = record.unit as string;
  const props = await show(unit, UNIT_PROPS);
  return {
    record,
    describe: driver.describe(record),
    procCgroup: await readOr(`/proc/${pid}/cgroup`),
    props,
    files: await limitFiles(props.ControlGroup ?? ''),
  };
}

async function kataUnits(): Promise<string> {
  const { stdout } = await run('systemctl', ['--user', 'list-units', '--all', '--no-legend', '--plain', 'kata-ts-*.scope']);
  return stdout.trim();
}

const podUid = '0f1e2d3c-4b5a-6978-8a9b-acbdcedfe0f1';
const podSlicePath = `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${podUid.replace(/-/g, '_')}.slice`;
const sid = (n: number) => n.toString(16).padStart(2, '0').repeat(32);
const limitsA: VmmLimits = { cpuQuotaMillicores: 1500, cpuRequestMillicores: 750, memoryLimitBytes: 512 * 1024 * 1024 };
const limitsB: VmmLimits = { cpuQuotaMillicores: 1234, cpuRequestMillicores: 1234, memoryLimitBytes: 768 * 1024 * 1024 };

async function main(): Promise<void> {
  // The manager takes its bus name a moment after start.
  let probe: unknown;
  for (let i = 0; i < 300; i++) {
    const r = await attempt(() => probeSystemdManager(address, logger, 2_000));
    probe = r;
    if (r.ok) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  out.probe = probe;
  const driver = createCgroupDriver('systemd', { cgroupRoot: '/sys/fs/cgroup', dbusAddress: address, logger, timeoutMs: 20_000 });

  // 1. Placement in the pod slice, then resize, then teardown after the process is gone.
  const a = startSleep();
  const placed = await attempt(() =>
    driver.place({ sandboxId: sid(1), cgroupParent: podSlicePath, pid: a.pid as number, limits: limitsA, pidsMax: 77 }),
  );
  out.place = placed.ok ? await observePlacement(driver, placed.value, a.pid as number) : placed;
  if (placed.ok) {
    const updated = await attempt(() => driver.update(placed.value, limitsB));
    out.update = updated.ok ? await observePlacement(driver, updated.value, a.pid as number) : updated;
    await killAndWait(a);
    out.remove = await attempt(() => driver.remove(updated.ok ? updated.value : placed.value));
    out.afterRemove = {
      props: await show(placed.value.unit as string, ['LoadState', 'ActiveState']),
      dirs: Object.fromEntries(
        await Promise.all(
          Object.entries(placed.value.paths).map(async ([k, d]) => [
            k,
            await fsp.stat(d).then(
              () => true,
              () => false,
            ),
          ]),
        ),
      ),
    };
    out.removeAgain = await attempt(() => driver.remove(placed.value));
  }

  // 2. UnitExists: a stale scope of the same name (made by systemd-run, an independent client,
  //    holding a process of its own) is stopped and the placement retried once.
  const staleUnit = `kata-ts-${sid(2)}`;
  const stale = spawn('systemd-run', ['--user', '--scope', `--unit=${staleUnit}`, 'sleep', '300'], { stdio: 'ignore' });
  children.push(stale);
  let staleActive = '';
  for (let i = 0; i < 100 && staleActive !== 'active'; i++) {
    staleActive = (await show(`${staleUnit}.scope`, ['ActiveState'])).ActiveState ?? '';
    if (staleActive !== 'active') await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const staleExit = new Promise<string>((resolve) => stale.once('exit', (code, sig) => resolve(`${code}/${sig}`)));
  const c = startSleep();
  const retried = await attempt(() =>
    driver.place({ sandboxId: sid(2), cgroupParent: podSlicePath, pid: c.pid as number, limits: limitsA }),
  );
  out.unitExists = {
    staleActiveBefore: staleActive,
    stalePid: stale.pid,
    result: retried.ok ? await observePlacement(driver, retried.value, c.pid as number) : retried,
    staleExit: await Promise.race([staleExit, new Promise((resolve) => setTimeout(() => resolve('still running'), 10_000))]),
  };
  await killAndWait(c);
  if (retried.ok) await driver.remove(retried.value);

  // 3. Empty parent (crictl): the manager's default slice. A bare slice name.
  for (const [key, parent, n] of [
    ['emptyParent', '', 3],
    ['bareSlice', 'kata-test-bare.slice', 4],
  ] as const) {
    const p = startSleep();
    const r = await attempt(() => driver.place({ sandboxId: sid(n), cgroupParent: parent, pid: p.pid as number, limits: limitsA }));
    out[key] = r.ok ? await observePlacement(driver, r.value, p.pid as number) : r;
    await killAndWait(p);
    if (r.ok) await driver.remove(r.value);
  }

  // 3b. The pool's cgroup (docs/pool.md): a top-level slice given a CPU weight of its own.
  const q = startSleep();
  const pooled = await attempt(() =>
    driver.place({
      sandboxId: sid(11),
      cgroupParent: 'kata_ts_pool.slice',
      pid: q.pid as number,
      limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 },
      parentCpuShares: 2,
    }),
  );
  out.poolSlice = pooled.ok
    ? {
        ...(await observePlacement(driver, pooled.value, q.pid as number)),
        sliceProps: await show('kata_ts_pool.slice', ['CPUShares']),
        sliceShares: await readOr('/sys/fs/cgroup/cpu/kata_ts_pool.slice/cpu.shares'),
      }
    : pooled;
  await killAndWait(q);
  if (pooled.ok) await driver.remove(pooled.value);

  // 4. Refusals: nothing may be left behind by any of them.
  const d = startSleep();
  out.refusals = {
    cgroupfsStyle: await attempt(() =>
      driver.place({ sandboxId: sid(5), cgroupParent: '/kubepods/burstable/pod123', pid: d.pid as number, limits: limitsA }),
    ),
    invalidSlice: await attempt(() =>
      driver.place({ sandboxId: sid(6), cgroupParent: 'kubepods--x.slice', pid: d.pid as number, limits: limitsA }),
    ),
    mismatchedPath: await attempt(() =>
      driver.place({ sandboxId: sid(7), cgroupParent: '/a.slice/b.slice', pid: d.pid as number, limits: limitsA }),
    ),
    deadPid: await attempt(() => driver.place({ sandboxId: sid(8), cgroupParent: podSlicePath, pid: 4_000_000, limits: limitsA })),
    updateMissing: await attempt(() =>
      driver.update(
        { driver: 'systemd', cgroupParent: '', mode: 'hybrid', unit: `kata-ts-${sid(9)}.scope`, paths: {}, limits: limitsA },
        limitsB,
      ),
    ),
    unreachable: await attempt(() =>
      createCgroupDriver('systemd', {
        cgroupRoot: '/sys/fs/cgroup',
        dbusAddress: 'unix:path=/nonexistent/kata-ts-bus',
        logger,
        timeoutMs: 5_000,
      }).place({
        sandboxId: sid(10),
        cgroupParent: podSlicePath,
        pid: d.pid as number,
        limits: limitsA,
      }),
    ),
    dProcCgroup: await readOr(`/proc/${d.pid}/cgroup`),
  };
  await killAndWait(d);
  out.leftUnits = await kataUnits();
}

try {
  await main();
} catch (err) {
  out.fatal = String((err as Error)?.stack ?? err);
} finally {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await fsp.writeFile(process.env.KATA_TS_RESULT as string, JSON.stringify(out, null, 1));
}
