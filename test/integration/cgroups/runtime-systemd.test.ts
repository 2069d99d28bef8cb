/**
 * RuntimeConfig and the cgroup driver actually used agree, end to end: the real `kata-ts serve`
 * daemon runs inside the confined systemd user manager (test/harness/systemd/, see its README),
 * with each cgroupDriver setting (auto with and without /run/systemd/system, systemd, cgroupfs),
 * and places real QEMU processes. Two real boots under TCG: one in the kubelet's pod slice through
 * systemd, one through cgroupfs; the other two settings are proven by a placement cut short right
 * after it happened (readyTimeoutMs 1) and rolled back. The scenario
 * (test/harness/systemd/scenario-runtime.ts) records what systemctl, /proc and the cgroup files
 * show; this file asserts on it and on the machine being left exactly as found.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { planLimits } from '../../../src/cgroups/limits.js';
import { type HarnessRun, runConfinedSystemd } from '../../harness/systemd/harness.js';
import type { RpcOutcome } from '../../helpers/cgroups-cri.js';
import { assertMachineClean } from '../../helpers/cgroups-machine.js';
import { processesCarryingMarker, RUN_MARKER_VAR } from '../../helpers/cgroups-observe.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';

interface HostLimits {
  cpuQuotaMillicores: number;
  cpuRequestMillicores: number;
  memoryLimitBytes: number;
}
interface Info {
  pid: number;
  phase: string;
  cgroup: Record<string, string>;
  plan: { host: HostLimits };
  guest: { vcpus: number } | null;
  exit: { reason: string } | null;
}
type View = { error: unknown } | { state: string; info: Info };
interface Traces {
  units: string;
  qemuPids: number[];
  workDirs: string[];
  records: string[];
}
interface Boot<R> {
  run: RpcOutcome<{ pod_sandbox_id: string }>;
  id: string;
  status: View;
  running: R & { aliveBeforeStop: boolean; procCgroup: string; markerInQemuEnv: boolean; pid: number };
  stop: RpcOutcome;
  afterStop: { alive: boolean; units: string; status: View };
  remove: RpcOutcome;
  afterRemove: Traces & { alive: boolean; statusAfter: RpcOutcome };
}
interface Placed {
  sandboxId: string;
  pid: number;
  placement: Record<string, string>;
}
interface Advertised {
  runtimeConfig: RpcOutcome<{ linux: { cgroup_driver: string } }>;
  statusCgroupDriver: { name: string; source: string };
  cgroupParent: string;
  mismatch: RpcOutcome;
  placements: Placed[];
}
type Refusal = Traces & { dirs: string[]; slice?: Record<string, string> };
interface Observations {
  fatal?: string;
  daemonLogTails?: unknown;
  probe: { ok: boolean };
  systemdDirExists: boolean;
  markerSeen: { systemd: boolean; dbusDaemon: boolean };
  auto: Advertised & {
    afterMismatch: Refusal;
    boot: Boot<{
      unit: string;
      props: Record<string, string>;
      unitsWhileRunning: string;
      files: Record<string, string | null>;
      scopeProcs: string | null;
    }>;
    afterRemoveScope: { props: Record<string, string>; dirs: string[] };
  };
  systemd: Advertised & {
    attempt: RpcOutcome;
    after: Traces & { podSlice: Record<string, string>; scopeDirs: string[] };
  };
  cgroupfs: Advertised & {
    afterMismatch: Refusal;
    boot: Boot<{ unitsWhileRunning: string; files: Record<string, string | null>; dirs: string[] }>;
    afterRemoveDirs: { leaf: string[]; kubepods: string[] };
  };
  autoNoSystemd: Advertised & { afterMismatch: Refusal; attempt: RpcOutcome; after: Traces & { kubepods: string[] } };
  finalUnits: string;
  qemuLeft: number[];
}

const SCENARIO = 'test/harness/systemd/scenario-runtime.ts';
/** The hierarchies a user manager on hybrid v1 really moves a scope's process in (harness README). */
const SYSTEMD_REALISED = ['', 'cpu', 'memory', 'name=systemd', 'pids'];
const NOTHING_LEFT = { units: '', qemuPids: [], workDirs: [], records: [] };

function infoOf(v: View): Info {
  if (!('info' in v)) throw new Error(`PodSandboxStatus failed: ${JSON.stringify(v.error)}`);
  return v.info;
}

/** Hierarchies (controller lists as /proc shows them) in which the process sits at exactly `cgroupPath`. */
function placedIn(procCgroup: string, cgroupPath: string): string[] {
  return procCgroup
    .split('\n')
    .filter((l) => l.endsWith(`:${cgroupPath}`))
    .map((l) => l.split(':')[1] as string)
    .sort();
}

/** systemctl's rendering of a usec property (`1.100000s`, `500ms`) in microseconds. */
function timespanUs(text: string | undefined): number {
  const m = /^([0-9]+(?:\.[0-9]+)?)(s|ms|us)$/.exec(text ?? '');
  if (m === null) throw new Error(`not a systemd timespan: ${text}`);
  const factor = { s: 1_000_000, ms: 1_000, us: 1 }[m[2] as 's' | 'ms' | 'us'];
  return Math.round(Number(m[1]) * factor);
}

function refusedWith(outcome: RpcOutcome) {
  return outcome.ok ? { ok: true } : { codeName: outcome.codeName, reason: outcome.reason };
}

describe('RuntimeConfig and the driver actually used agree, end to end in a confined systemd --user (real daemon, real QEMU)', () => {
  let run: HarnessRun<Observations> | undefined;
  let obs: Observations;
  const marker = randomBytes(8).toString('hex');

  beforeAll(async () => {
    await ensureGuestAssets();
    run = await runConfinedSystemd<Observations>({ scenario: SCENARIO, env: { [RUN_MARKER_VAR]: marker }, timeoutMs: 220_000 });
    if (run.exitCode !== 0 || run.result === undefined || run.result.fatal !== undefined) {
      throw new Error(
        `harness or scenario failed (exit ${run.exitCode}, signal ${run.signal}):\n${run.stderr}\n${run.result?.fatal ?? ''}\n` +
          `${JSON.stringify(run.result?.daemonLogTails ?? null, null, 1)}\n${run.systemdLog.slice(-3000)}`,
      );
    }
    obs = run.result;
  });

  afterAll(async () => {
    // The harness has torn everything down by now, failed or not; check it independently.
    expect(processesCarryingMarker(marker)).toEqual([]);
    await assertMachineClean();
  });

  it('ran inside the confinement next to a reachable user manager, /run/systemd/system present', () => {
    expect(run?.systemdStarted).toBe(true);
    expect(run?.stderr).toContain('is in the private cgroups');
    expect(obs.probe.ok).toBe(true);
    expect(obs.systemdDirExists).toBe(true);
    // What the final leftover check looks for is really carried by systemd, its bus and QEMU.
    expect(obs.markerSeen).toEqual({ systemd: true, dbusDaemon: true });
    expect(obs.auto.boot.running.markerInQemuEnv).toBe(true);
  });

  describe('cgroupDriver auto with /run/systemd/system and the confined user bus', () => {
    it('RuntimeConfig answers SYSTEMD and Status verbose info says systemd, detected', () => {
      expect(obs.auto.runtimeConfig).toEqual({ ok: true, value: { linux: { cgroup_driver: 'SYSTEMD' } } });
      expect(obs.auto.statusCgroupDriver).toEqual({ name: 'systemd', source: 'detected' });
    });

    it("RunPodSandbox with the kubelet's pod slice boots a real VM whose QEMU is in kata-ts-<id>.scope under that slice", () => {
      const { boot, cgroupParent } = obs.auto;
      expect(boot.run.ok).toBe(true);
      const info = infoOf(boot.status);
      expect(boot.status).toMatchObject({ state: 'SANDBOX_READY' });
      expect(info.phase).toBe('running');
      expect(info.guest?.vcpus).toBeGreaterThan(0); // the guest really booted and reported
      const unit = `kata-ts-${boot.id}.scope`;
      const controlGroup = `${cgroupParent}/${unit}`;
      const podSlice = cgroupParent.split('/').pop();
      expect(boot.running.pid).toBe(info.pid);
      expect(boot.running.aliveBeforeStop).toBe(true);
      // systemd's own view (systemctl over the bus), not the driver's.
      expect(boot.running.props).toMatchObject({
        LoadState: 'loaded',
        ActiveState: 'active',
        Slice: podSlice,
        ControlGroup: controlGroup,
        Delegate: 'yes',
        DefaultDependencies: 'no',
      });
      expect(boot.running.unitsWhileRunning).toContain(`${unit} loaded active running`);
      // The kernel's view: /proc/<qemu pid>/cgroup and the scope's cgroup.procs.
      expect(placedIn(boot.running.procCgroup, controlGroup)).toEqual(SYSTEMD_REALISED);
      expect(boot.running.scopeProcs?.split('\n')).toContain(String(info.pid));
      // PodSandboxStatus verbose info names the same driver, unit and slice.
      expect(info.cgroup).toMatchObject({
        cgroupDriver: 'systemd',
        cgroupMode: 'hybrid',
        systemdUnit: unit,
        systemdSlice: podSlice,
        cgroupParent,
      });
    });

    it('the limits a v1 hybrid user manager applies (cpu quota and shares, memory) hold plan.host', () => {
      const { running, status } = obs.auto.boot;
      const plan = planLimits(infoOf(status).plan.host);
      expect(plan.memoryBytes).toBeGreaterThan(0);
      expect(plan.quotaUs).toBeGreaterThan(0);
      expect(running.props.MemoryLimit).toBe(String(plan.memoryBytes));
      expect(running.props.CPUShares).toBe(String(plan.shares));
      expect(timespanUs(running.props.CPUQuotaPerSecUSec)).toBe((plan.systemdQuotaUs * 1_000_000) / plan.periodUs);
      expect(running.files).toMatchObject({
        'cpu.cfs_period_us': String(plan.periodUs),
        'cpu.cfs_quota_us': String(plan.systemdQuotaUs),
        'cpu.shares': String(plan.shares),
        'memory.limit_in_bytes': String(plan.memoryBytes),
      });
      expect(Number(running.files['pids.current'])).toBeGreaterThan(0); // QEMU's threads are counted there
    });

    it('a cgroupfs-style parent is refused with FAILED_PRECONDITION (CGROUP_PARENT_STYLE_MISMATCH): no unit, no QEMU, no files', () => {
      expect(refusedWith(obs.auto.mismatch)).toEqual({ codeName: 'FAILED_PRECONDITION', reason: 'CGROUP_PARENT_STYLE_MISMATCH' });
      expect(obs.auto.mismatch.ok ? '' : obs.auto.mismatch.details).toMatch(/cgroupfs path.*systemd/);
      expect(obs.auto.afterMismatch).toEqual({ ...NOTHING_LEFT, dirs: [] });
    });

    it('StopPodSandbox + RemovePodSandbox: QEMU gone, the scope stopped and reset, nothing left', () => {
      const { boot, afterRemoveScope } = obs.auto;
      expect(boot.stop).toEqual({ ok: true, value: {} });
      expect(boot.afterStop.alive).toBe(false);
      expect(boot.afterStop.units).toBe('');
      expect(boot.afterStop.status).toMatchObject({
        state: 'SANDBOX_NOTREADY',
        info: { exit: { reason: 'stopped' }, cgroup: { placed: false } },
      });
      expect(boot.remove).toEqual({ ok: true, value: {} });
      expect(boot.afterRemove).toMatchObject({ alive: false, ...NOTHING_LEFT, statusAfter: { ok: false, codeName: 'NOT_FOUND' } });
      expect(afterRemoveScope.props).toEqual({ LoadState: 'not-found', ActiveState: 'inactive' });
      expect(afterRemoveScope.dirs).toEqual([]);
    });
  });

  describe('cgroupDriver systemd, set explicitly', () => {
    it('RuntimeConfig answers SYSTEMD, Status says systemd from the config; a cgroupfs-style parent is refused', () => {
      expect(obs.systemd.runtimeConfig).toEqual({ ok: true, value: { linux: { cgroup_driver: 'SYSTEMD' } } });
      expect(obs.systemd.statusCgroupDriver).toEqual({ name: 'systemd', source: 'config' });
      expect(refusedWith(obs.systemd.mismatch)).toEqual({ codeName: 'FAILED_PRECONDITION', reason: 'CGROUP_PARENT_STYLE_MISMATCH' });
    });

    it('a placement cut short after it happened went through systemd into the pod slice, and was rolled back fully', () => {
      const s = obs.systemd;
      expect(refusedWith(s.attempt)).toEqual({ codeName: 'DEADLINE_EXCEEDED', reason: 'GUEST_READY_TIMEOUT' });
      expect(s.placements).toHaveLength(1);
      const id = s.placements[0]!.sandboxId;
      expect(s.placements[0]!.placement).toMatchObject({
        cgroupDriver: 'systemd',
        systemdUnit: `kata-ts-${id}.scope`,
        cgroupParent: s.cgroupParent,
      });
      // systemd itself made the pod's slice (only a scope placed in it could have), and the scope is gone.
      expect(s.after.podSlice).toEqual({ ActiveState: 'active', ControlGroup: s.cgroupParent });
      expect(s.after.scopeDirs).toEqual([]);
      expect(s.after).toMatchObject(NOTHING_LEFT);
    });
  });

  describe('cgroupDriver cgroupfs, set explicitly although systemd runs here', () => {
    it('RuntimeConfig answers CGROUPFS, Status says cgroupfs from the config; a systemd-style parent is refused, nothing made', () => {
      const c = obs.cgroupfs;
      expect(c.runtimeConfig).toEqual({ ok: true, value: { linux: { cgroup_driver: 'CGROUPFS' } } });
      expect(c.statusCgroupDriver).toEqual({ name: 'cgroupfs', source: 'config' });
      expect(refusedWith(c.mismatch)).toEqual({ codeName: 'FAILED_PRECONDITION', reason: 'CGROUP_PARENT_STYLE_MISMATCH' });
      expect(c.mismatch.ok ? '' : c.mismatch.details).toMatch(/systemd slice.*cgroupfs/);
      expect(c.afterMismatch).toMatchObject({ ...NOTHING_LEFT, dirs: [] });
      expect(c.afterMismatch.slice?.ActiveState).toBe('inactive');
    });

    it('RunPodSandbox boots a real VM placed by cgroupfs under cgroup_parent with the planned limits, and no scope', () => {
      const { boot, cgroupParent } = obs.cgroupfs;
      const info = infoOf(boot.status);
      expect(boot.status).toMatchObject({ state: 'SANDBOX_READY' });
      const dir = `${cgroupParent}/kata-ts-${boot.id}`;
      expect(info.cgroup).toMatchObject({ cgroupDriver: 'cgroupfs', cgroupMode: 'hybrid', cgroupParent });
      expect(info.cgroup.systemdUnit).toBeUndefined();
      expect(boot.running.unitsWhileRunning).toBe('');
      expect(placedIn(boot.running.procCgroup, dir)).toEqual(expect.arrayContaining(['cpu', 'memory', 'pids']));
      expect(boot.running.dirs).toEqual(expect.arrayContaining(['cpu', 'memory', 'pids']));
      const plan = planLimits(info.plan.host);
      expect(boot.running.files).toMatchObject({
        'cpu.cfs_period_us': String(plan.periodUs),
        'cpu.cfs_quota_us': String(plan.quotaUs),
        'cpu.shares': String(plan.shares),
        'memory.limit_in_bytes': String(plan.memoryBytes),
      });
    });

    it('Stop + Remove end QEMU and remove its directories and the parents it created', () => {
      const { boot, afterRemoveDirs } = obs.cgroupfs;
      expect(boot.stop.ok && boot.remove.ok).toBe(true);
      expect(boot.afterStop.alive).toBe(false);
      expect(boot.afterRemove).toMatchObject({ alive: false, ...NOTHING_LEFT });
      expect(afterRemoveDirs).toEqual({ leaf: [], kubepods: [] });
    });
  });

  describe('cgroupDriver auto without /run/systemd/system', () => {
    it('RuntimeConfig answers CGROUPFS (detected); a systemd-style parent is refused; a cut-short placement used cgroupfs and was rolled back', () => {
      const a = obs.autoNoSystemd;
      expect(a.runtimeConfig).toEqual({ ok: true, value: { linux: { cgroup_driver: 'CGROUPFS' } } });
      expect(a.statusCgroupDriver).toEqual({ name: 'cgroupfs', source: 'detected' });
      expect(refusedWith(a.mismatch)).toEqual({ codeName: 'FAILED_PRECONDITION', reason: 'CGROUP_PARENT_STYLE_MISMATCH' });
      expect(a.afterMismatch).toMatchObject({ ...NOTHING_LEFT, dirs: [] });
      expect(refusedWith(a.attempt)).toEqual({ codeName: 'DEADLINE_EXCEEDED', reason: 'GUEST_READY_TIMEOUT' });
      expect(a.placements).toHaveLength(1);
      expect(a.placements[0]!.placement).toMatchObject({ cgroupDriver: 'cgroupfs', cgroupParent: a.cgroupParent });
      expect(a.placements[0]!.placement.systemdUnit).toBeUndefined();
      expect(a.after).toEqual({ ...NOTHING_LEFT, kubepods: [] });
    });
  });

  it('in every configuration the driver RuntimeConfig names is the one that placed every VMM', () => {
    const table = (['auto', 'systemd', 'cgroupfs', 'autoNoSystemd'] as const).map((k) => {
      const c = obs[k];
      return {
        config: k,
        advertised: c.runtimeConfig.ok ? c.runtimeConfig.value.linux.cgroup_driver.toLowerCase() : 'none',
        used: [...new Set(c.placements.map((p) => p.placement.cgroupDriver))],
      };
    });
    expect(table).toEqual([
      { config: 'auto', advertised: 'systemd', used: ['systemd'] },
      { config: 'systemd', advertised: 'systemd', used: ['systemd'] },
      { config: 'cgroupfs', advertised: 'cgroupfs', used: ['cgroupfs'] },
      { config: 'autoNoSystemd', advertised: 'cgroupfs', used: ['cgroupfs'] },
    ]);
    expect(obs.finalUnits).toBe('');
    expect(obs.qemuLeft).toEqual([]);
  });

  it('left PID 1, the private cgroups and the processes exactly as found', () => {
    expect(run?.pid1After).toBe(run?.pid1Before);
    expect(
      run?.pid1After
        .trim()
        .split('\n')
        .every((l) => l.endsWith(':/')),
    ).toBe(true);
    expect(readFileSync('/proc/1/cgroup', 'utf8')).toBe(run?.pid1Before);
    expect(run?.leftoverCgroups).toEqual([]);
    expect(run?.leftoverProcesses).toEqual([]);
    // systemd --user, its dbus-daemon, the daemons and QEMU all carried the marker (checked above).
    expect(processesCarryingMarker(marker)).toEqual([]);
  });
});
