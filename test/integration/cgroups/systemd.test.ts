/**
 * The systemd cgroup driver against a REAL systemd user manager, confined as
 * /work/shared/ENVIRONMENT.md describes (test/harness/systemd/). The driver runs inside the
 * harness's namespaces (test/harness/systemd/scenario-placement.ts records what it sees through
 * systemctl, systemd-run and the cgroup files); this file asserts on those observations and on
 * the machine being left exactly as found.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { planLimits } from '../../../src/cgroups/limits.js';
import { type HarnessRun, runConfinedSystemd } from '../../harness/systemd/harness.js';
import { assertMachineClean } from '../../helpers/cgroups-machine.js';

interface ErrorShape {
  kind?: string;
  reason?: string;
  message: string;
}
type Attempt<T> = { ok: true; value: T } | { ok: false; error: ErrorShape };
interface Placement {
  record: {
    driver: string;
    mode: string;
    unit: string;
    slice: string;
    cgroupParent: string;
    paths: Record<string, string>;
    limits: Record<string, number>;
  };
  describe: Record<string, string>;
  procCgroup: string;
  props: Record<string, string>;
  files: Record<string, string | null>;
}
interface Observations {
  fatal?: string;
  probe: Attempt<{ version: string }>;
  place: Placement;
  update: Placement;
  remove: Attempt<void>;
  afterRemove: { props: Record<string, string>; dirs: Record<string, boolean> };
  removeAgain: Attempt<void>;
  unitExists: { staleActiveBefore: string; stalePid: number; result: Placement; staleExit: string };
  emptyParent: Placement;
  bareSlice: Placement;
  poolSlice: Placement & { sliceProps: Record<string, string>; sliceShares: string | null };
  refusals: Record<'cgroupfsStyle' | 'invalidSlice' | 'mismatchedPath' | 'deadPid' | 'updateMissing' | 'unreachable', Attempt<unknown>> & {
    dProcCgroup: string;
  };
  leftUnits: string;
}

const podSlice = 'kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_acbdcedfe0f1.slice';
const podSlicePath = `/kubepods.slice/kubepods-burstable.slice/${podSlice}`;
const sid = (n: number) => n.toString(16).padStart(2, '0').repeat(32);
const MiB = 1024 * 1024;

function placedIn(p: Placement, controlGroup: string): string[] {
  // Hierarchies (by controller list) in which the pid sits exactly in the scope's cgroup.
  return p.procCgroup
    .split('\n')
    .filter((l) => l.endsWith(`:${controlGroup}`))
    .map((l) => l.split(':')[1] as string);
}

describe('systemd driver on a confined systemd --user (real systemd 252, cgroup v1 hybrid)', () => {
  let run: HarnessRun<Observations>;
  let obs: Observations;

  beforeAll(async () => {
    run = await runConfinedSystemd<Observations>({ scenario: 'test/harness/systemd/scenario-placement.ts' });
    if (run.exitCode !== 0 || run.result === undefined) {
      throw new Error(`harness failed (exit ${run.exitCode}, signal ${run.signal}):\n${run.stderr}\n${run.systemdLog.slice(-4000)}`);
    }
    obs = run.result;
  });

  afterAll(async () => {
    // Independent of the harness's own bookkeeping: the machine as found.
    await assertMachineClean();
  });

  it('confined itself and ran the scenario to the end inside', () => {
    expect(run.systemdStarted).toBe(true);
    expect(run.stderr).toContain('is in the private cgroups');
    expect(obs.fatal).toBeUndefined();
    expect(obs.probe).toMatchObject({ ok: true });
    if (obs.probe.ok) expect(obs.probe.value.version).toMatch(/^25\d/);
  });

  it('creates kata-ts-<id>.scope in the pod slice and moves the pid into it', () => {
    const p = obs.place;
    const controlGroup = `${podSlicePath}/kata-ts-${sid(1)}.scope`;
    expect(p.record).toMatchObject({
      driver: 'systemd',
      mode: 'hybrid',
      unit: `kata-ts-${sid(1)}.scope`,
      slice: podSlice,
      cgroupParent: podSlicePath,
    });
    expect(p.props).toMatchObject({ LoadState: 'loaded', ActiveState: 'active', Slice: podSlice, ControlGroup: controlGroup });
    // The user manager on hybrid moves the process in the named hierarchy, cgroup2 and the v1
    // controllers it realises (cpu, memory, pids); cpuset/cpuacct/blkio/devices/freezer it leaves.
    expect(placedIn(p, controlGroup).sort()).toEqual(['', 'cpu', 'memory', 'name=systemd', 'pids']);
    expect(Object.keys(p.record.paths).sort()).toEqual(['cpu', 'memory', 'pids', 'systemd', 'unified']);
    expect(p.record.paths.memory).toBe(`/sys/fs/cgroup/memory${controlGroup}`);
    expect(p.describe).toMatchObject({ cgroupDriver: 'systemd', systemdUnit: `kata-ts-${sid(1)}.scope`, systemdSlice: podSlice });
    expect(p.files['pids.current']).toBe('1');
  });

  it('sets every property as asked (read back over D-Bus by systemctl)', () => {
    expect(obs.place.props).toMatchObject({
      Delegate: 'yes',
      DefaultDependencies: 'no',
      CPUAccounting: 'yes',
      MemoryAccounting: 'yes',
      TasksAccounting: 'yes',
      Description: `kata-ts VMM of sandbox ${sid(1)}`,
      // v1 names on a hybrid host; the v2 ones stay unset.
      MemoryLimit: String(512 * MiB),
      CPUShares: '768', // 750m * 1024 / 1000
      CPUQuotaPerSecUSec: '1.500000s',
      MemoryMax: 'infinity',
      CPUWeight: '[not set]',
      // The VMM's task limit (vmmPidsMax), as TasksMax.
      TasksMax: '77',
    });
  });

  it('the user manager applies the limits to the v1 cpu and memory files', () => {
    expect(obs.place.files).toMatchObject({
      'cpu.cfs_quota_us': '150000',
      'cpu.cfs_period_us': '100000',
      'cpu.shares': '768',
      'memory.limit_in_bytes': String(512 * MiB),
      'pids.max': '77',
    });
  });

  it('resizes with SetUnitProperties, the quota rounded up to whole percent as systemd keeps it', () => {
    const plan = planLimits({ cpuQuotaMillicores: 1234, cpuRequestMillicores: 1234, memoryLimitBytes: 768 * MiB });
    expect(plan.systemdQuotaUs).toBe(124_000);
    expect(obs.update.record.limits).toEqual({ cpuQuotaMillicores: 1234, cpuRequestMillicores: 1234, memoryLimitBytes: 768 * MiB });
    expect(obs.update.props).toMatchObject({ MemoryLimit: String(768 * MiB), CPUShares: '1263', CPUQuotaPerSecUSec: '1.240000s' });
    expect(obs.update.files).toMatchObject({
      'cpu.cfs_quota_us': String(plan.systemdQuotaUs),
      'cpu.shares': String(plan.shares),
      'memory.limit_in_bytes': String(768 * MiB),
    });
  });

  it('teardown (StopUnit, ResetFailedUnit) removes the unit and its cgroups; a second remove is a no-op', () => {
    expect(obs.remove).toEqual({ ok: true });
    expect(obs.afterRemove.props).toEqual({ LoadState: 'not-found', ActiveState: 'inactive' });
    expect(Object.values(obs.afterRemove.dirs)).toEqual([false, false, false, false, false]);
    expect(obs.removeAgain).toEqual({ ok: true });
  });

  it('on UnitExists stops the stale scope (its process is terminated) and retries once', () => {
    const u = obs.unitExists;
    expect(u.staleActiveBefore).toBe('active');
    expect(u.staleExit).toBe('null/SIGTERM');
    const controlGroup = `${podSlicePath}/kata-ts-${sid(2)}.scope`;
    expect(u.result.props).toMatchObject({ ActiveState: 'active', ControlGroup: controlGroup, MemoryLimit: String(512 * MiB) });
    expect(placedIn(u.result, controlGroup)).toContain('name=systemd');
  });

  it('an empty cgroup_parent (crictl) lands in the manager default slice; a bare slice is expanded', () => {
    expect(obs.emptyParent.record.slice).toBe('app.slice');
    expect(obs.emptyParent.props.ControlGroup).toBe(`/app.slice/kata-ts-${sid(3)}.scope`);
    expect(obs.bareSlice.props.ControlGroup).toBe(`/kata.slice/kata-test.slice/kata-test-bare.slice/kata-ts-${sid(4)}.scope`);
    expect(obs.bareSlice.record.paths.systemd).toBe(`/sys/fs/cgroup/systemd${obs.bareSlice.props.ControlGroup}`);
  });

  it("gives the pool's slice a CPU weight of its own (SetUnitProperties CPUShares), and its scope the same", () => {
    expect(obs.poolSlice.props.ControlGroup).toBe(`/kata_ts_pool.slice/kata-ts-${sid(11)}.scope`);
    expect([obs.poolSlice.sliceProps.CPUShares, obs.poolSlice.sliceShares, obs.poolSlice.files['cpu.shares']]).toEqual(['2', '2', '2']);
  });

  it('refuses what it cannot honour, precisely, and leaves no unit and no moved process', () => {
    const r = obs.refusals;
    const err = (a: Attempt<unknown>) => (a.ok ? undefined : { kind: a.error.kind, reason: a.error.reason });
    expect(err(r.cgroupfsStyle)).toEqual({ kind: 'precondition', reason: 'CGROUP_PARENT_STYLE_MISMATCH' });
    expect(r.cgroupfsStyle.ok ? '' : r.cgroupfsStyle.error.message).toMatch(/cgroupfs path.*systemd.*slice/);
    expect(err(r.invalidSlice)).toEqual({ kind: 'invalid', reason: 'CGROUP_PARENT_INVALID' });
    expect(err(r.mismatchedPath)).toEqual({ kind: 'invalid', reason: 'CGROUP_PARENT_INVALID' });
    expect(err(r.deadPid)).toEqual({ kind: 'precondition', reason: 'CGROUP_PID_GONE' });
    expect(err(r.updateMissing)).toEqual({ kind: 'not_found', reason: 'SYSTEMD_NO_SUCH_UNIT' });
    expect(err(r.unreachable)).toEqual({ kind: 'unavailable', reason: 'SYSTEMD_UNAVAILABLE' });
    // The process offered to the refused placements never moved.
    expect(r.dProcCgroup.split('\n').every((l) => l.endsWith(':/'))).toBe(true);
    expect(obs.leftUnits).toBe('');
  });

  it('left PID 1, the private cgroups and the processes exactly as found', () => {
    expect(run.pid1After).toBe(run.pid1Before);
    expect(
      run.pid1After
        .trim()
        .split('\n')
        .every((l) => l.endsWith(':/')),
    ).toBe(true);
    expect(readFileSync('/proc/1/cgroup', 'utf8')).toBe(run.pid1Before);
    expect(run.leftoverCgroups).toEqual([]);
    expect(run.leftoverProcesses).toEqual([]);
  });
});

describe('systemd harness confinement guard', () => {
  it('refuses to start systemd when the shell is not in the private cgroups', async () => {
    const pid1 = readFileSync('/proc/1/cgroup', 'utf8');
    const refused = await runConfinedSystemd<unknown>({
      scenario: 'test/harness/systemd/scenario-placement.ts',
      expectedCgroupOverride: '0::/not-the-private-cgroup',
    });
    expect(refused.exitCode).toBe(97);
    expect(refused.stderr).toContain('REFUSING to start systemd');
    expect(refused.result).toBeUndefined();
    expect(refused.systemdStarted).toBe(false);
    expect(refused.leftoverCgroups).toEqual([]);
    expect(refused.leftoverProcesses).toEqual([]);
    expect(readFileSync('/proc/1/cgroup', 'utf8')).toBe(pid1);
  });
});
