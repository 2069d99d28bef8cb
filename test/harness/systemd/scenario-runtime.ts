/**
 * Runs INSIDE the confined namespaces (started by inner.sh), next to the real user manager: the
 * real `kata-ts serve` daemon, started with each cgroupDriver setting, answers RuntimeConfig and
 * Status and places real QEMU processes. Recorded as JSON in $KATA_TS_RESULT through independent
 * observers (systemctl, /proc, the cgroup files); the outer test
 * (test/integration/cgroups/runtime-systemd.test.ts) asserts on it. Nothing here asserts.
 *
 * Configurations, in order (two real boots in all):
 * - auto, /run/systemd/system present: RuntimeConfig SYSTEMD; a cgroupfs-style parent refused;
 *   one real boot in the kubelet's pod slice; Stop + Remove.
 * - systemd set explicitly: RuntimeConfig SYSTEMD; a cgroupfs-style parent refused; one placement
 *   attempt that is cut short after placement (readyTimeoutMs 1) and rolled back.
 * - cgroupfs set explicitly (the systemd directory still present): RuntimeConfig CGROUPFS; a
 *   systemd-style parent refused; one real boot placed by cgroupfs, no scope; Stop + Remove.
 * - auto, systemd directory absent: RuntimeConfig CGROUPFS; a systemd-style parent refused; one
 *   placement attempt cut short and rolled back.
 */
import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { probeSystemdManager } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { readProcStat } from '../../../src/hypervisor/index.js';
import { outcome } from '../../helpers/cgroups-cri.js';
import { type DaemonProcess, startDaemonProcess, stateLeftovers } from '../../helpers/cgroups-daemon.js';
import {
  carriesMarker,
  dirsPresent,
  kataUnits,
  pidsMentioning,
  RUN_MARKER_VAR,
  readOr,
  systemctlShow,
  v1LimitFiles,
} from '../../helpers/cgroups-observe.js';

const address = process.env.DBUS_SESSION_BUS_ADDRESS as string;
const work = process.env.KATA_TS_WORK_DIR as string;
const marker = process.env[RUN_MARKER_VAR] ?? '';
const CGROUP_ROOT = '/sys/fs/cgroup';
const SYSTEMD_DIR = '/run/systemd/system';
const out: Record<string, unknown> = {};
const daemons: DaemonProcess[] = [];

const UNIT_PROPS = [
  'LoadState',
  'ActiveState',
  'ControlGroup',
  'Slice',
  'Delegate',
  'DefaultDependencies',
  'MemoryLimit',
  'CPUShares',
  'CPUQuotaPerSecUSec',
];

/** A pod as a kubelet describes it, with a cgroup_parent of the given style. */
function pod(name: string, style: 'systemd' | 'cgroupfs') {
  const uid = randomUUID();
  const cgroupParent =
    style === 'systemd'
      ? `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${uid.replace(/-/g, '_')}.slice`
      : `/kubepods/burstable/pod${uid}`;
  const config: PodSandboxConfig = {
    metadata: { name, namespace: 'kata-ts-test', uid, attempt: 0 },
    labels: { app: name },
    log_directory: `/var/log/pods/kata-ts-test_${name}_${uid}`,
    linux: { cgroup_parent: cgroupParent, security_context: { namespace_options: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } } },
    pod_resources: {
      containers: [
        {
          name: 'app',
          type: 'REGULAR_CONTAINER',
          kubernetes_resources: { requests: { cpu: { string: '500m' }, memory: { string: '256Mi' } }, limits: {} },
        },
      ],
    },
  };
  return { uid, cgroupParent, config };
}

function alive(pid: number): boolean {
  const stat = readProcStat(pid);
  return stat !== undefined && stat.state !== 'Z' && stat.state !== 'X';
}

/** What a daemon leaves on the host: scopes, QEMU processes, state files. */
async function hostTraces(d: DaemonProcess) {
  return { units: await kataUnits(), qemuPids: pidsMentioning(path.join(d.stateDir, 'vm')), ...(await stateLeftovers(d.stateDir)) };
}

async function start(name: string, config: Record<string, unknown>): Promise<DaemonProcess> {
  const d = await startDaemonProcess(path.join(work, name), config);
  daemons.push(d);
  return d;
}

/** RuntimeConfig, and Status verbose info's cgroupDriver, as the kubelet would read them. */
async function advertised(d: DaemonProcess) {
  const rc = await outcome(d.cri.runtime.RuntimeConfig({}));
  const st = await outcome(d.cri.runtime.Status({ verbose: true }));
  return { runtimeConfig: rc, statusCgroupDriver: st.ok ? (JSON.parse(st.value.info.cgroupDriver ?? 'null') as unknown) : st };
}

/** The daemon's 'VMM placed' log lines: which driver placed which sandbox, and where. */
async function placementsLogged(d: DaemonProcess) {
  return (await d.logLines())
    .filter((l) => l.msg === 'VMM placed before it runs')
    .map((l) => ({ sandboxId: l.sandboxId, pid: l.pid, placement: l.placement }));
}

type SandboxView = { error: unknown } | { state: string; info: Record<string, unknown> & { pid: number } };

/** PodSandboxStatus, verbose: the state and the parsed `info` JSON (pid, cgroup, plan, ...). */
async function sandboxInfo(d: DaemonProcess, id: string): Promise<SandboxView> {
  const res = await outcome(
    d.cri.runtime.PodSandboxStatus({
      pod_sandbox_id: id,
      verbose: true,
    }),
  );
  if (!res.ok) return { error: res };
  return { state: res.value.status!.state, info: JSON.parse(res.value.info.info ?? 'null') as Record<string, unknown> & { pid: number } };
}

/** One real boot, observed while it runs, then Stop and Remove observed. */
async function bootAndTearDown(d: DaemonProcess, p: ReturnType<typeof pod>, observeRunning: (id: string, pid: number) => Promise<unknown>) {
  const ran = await outcome(d.cri.runtime.RunPodSandbox({ config: p.config, runtime_handler: 'kata-ts' }));
  if (!ran.ok) return { run: ran };
  const id = ran.value.pod_sandbox_id;
  const status = await sandboxInfo(d, id);
  const pid = 'info' in status ? status.info.pid : -1;
  const running = {
    aliveBeforeStop: alive(pid),
    procCgroup: await readOr(`/proc/${pid}/cgroup`),
    markerInQemuEnv: carriesMarker(pid, marker),
    ...((await observeRunning(id, pid)) as object),
  };
  const stop = await outcome(d.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }));
  const afterStop = { alive: alive(pid), units: await kataUnits(), status: await sandboxInfo(d, id) };
  const remove = await outcome(d.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }));
  const afterRemove = {
    alive: alive(pid),
    statusAfter: await outcome(d.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id })),
    ...(await hostTraces(d)),
  };
  return { run: ran, id, status, running, stop, afterStop, remove, afterRemove };
}

/**
 * RunPodSandbox with a systemd-style parent under the cgroupfs driver, and what it left: neither
 * the cgroupfs driver (mkdir) nor systemd (a slice) may have made the refused pod's cgroup.
 */
async function refuseSystemdStyle(d: DaemonProcess) {
  const refused = pod('mismatch', 'systemd');
  const mismatch = await outcome(d.cri.runtime.RunPodSandbox({ config: refused.config, runtime_handler: 'kata-ts' }));
  const afterMismatch = {
    ...(await hostTraces(d)),
    dirs: await dirsPresent(CGROUP_ROOT, refused.cgroupParent),
    slice: await systemctlShow(path.basename(refused.cgroupParent), ['ActiveState']),
  };
  return { mismatch, afterMismatch };
}

async function waitForManager(): Promise<unknown> {
  let last: unknown;
  for (let i = 0; i < 300; i++) {
    try {
      return { ok: true, value: await probeSystemdManager(address, silentLogger(), 2_000) };
    } catch (err) {
      last = String(err);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return { ok: false, error: last };
}

async function main(): Promise<void> {
  out.probe = await waitForManager();
  out.systemdDirExists = await fsp.stat(SYSTEMD_DIR).then(
    (s) => s.isDirectory(),
    () => false,
  );
  // The processes the outer test looks for afterwards must really carry the marker.
  const sdPid = Number(await readOr(path.join(work, 'systemd.pid')));
  const busPid = Number((await systemctlShow('dbus.service', ['MainPID'])).MainPID);
  out.markerSeen = { systemd: carriesMarker(sdPid, marker), dbusDaemon: busPid > 0 && carriesMarker(busPid, marker) };

  // 1-4: auto, with the systemd directory present and the confined user bus.
  {
    const d = await start('auto', { cgroupDriver: 'auto', systemdRuntimeDir: SYSTEMD_DIR, dbusAddress: address });
    const mismatchPod = pod('mismatch', 'cgroupfs');
    const mismatch = await outcome(d.cri.runtime.RunPodSandbox({ config: mismatchPod.config, runtime_handler: 'kata-ts' }));
    const afterMismatch = {
      ...(await hostTraces(d)),
      dirs: await dirsPresent(CGROUP_ROOT, 'kubepods'),
      units: await kataUnits(),
    };
    const p = pod('web', 'systemd');
    const boot = await bootAndTearDown(d, p, async (id, pid) => {
      const unit = `kata-ts-${id}.scope`;
      const props = await systemctlShow(unit, UNIT_PROPS);
      return {
        unit,
        props,
        unitsWhileRunning: await kataUnits(),
        files: await v1LimitFiles(CGROUP_ROOT, props.ControlGroup ?? '/nonexistent'),
        scopeProcs: await readOr(path.join(CGROUP_ROOT, 'systemd', props.ControlGroup ?? '/nonexistent', 'cgroup.procs')),
        pid,
      };
    });
    const controlGroup = 'id' in boot ? `${p.cgroupParent}/kata-ts-${boot.id}.scope` : '/nonexistent';
    out.auto = {
      ...(await advertised(d)),
      cgroupParent: p.cgroupParent,
      mismatch,
      afterMismatch,
      boot,
      afterRemoveScope: {
        props: 'id' in boot ? await systemctlShow(`kata-ts-${boot.id}.scope`, ['LoadState', 'ActiveState']) : null,
        dirs: await dirsPresent(CGROUP_ROOT, controlGroup),
      },
      placements: await placementsLogged(d),
    };
    await d.stop();
  }

  // systemd set explicitly: a placement attempt cut short right after placement.
  {
    const d = await start('systemd', {
      cgroupDriver: 'systemd',
      systemdRuntimeDir: SYSTEMD_DIR,
      dbusAddress: address,
      hypervisor: { readyTimeoutMs: 1 },
    });
    const mismatch = await outcome(d.cri.runtime.RunPodSandbox({ config: pod('mismatch', 'cgroupfs').config, runtime_handler: 'kata-ts' }));
    const p = pod('cut-short', 'systemd');
    const attempt = await outcome(d.cri.runtime.RunPodSandbox({ config: p.config, runtime_handler: 'kata-ts' }));
    out.systemd = {
      ...(await advertised(d)),
      cgroupParent: p.cgroupParent,
      mismatch,
      attempt,
      placements: await placementsLogged(d),
      after: {
        ...(await hostTraces(d)),
        // systemd made the pod's slice for the scope (slices outlive their scopes): the placement
        // really went through the manager, and its scope is gone again.
        podSlice: await systemctlShow(path.basename(p.cgroupParent), ['ActiveState', 'ControlGroup']),
        scopeDirs: await dirsPresent(CGROUP_ROOT, `${p.cgroupParent}/kata-ts-${String((await placementsLogged(d))[0]?.sandboxId)}.scope`),
      },
    };
    await d.stop();
  }

  // cgroupfs set explicitly although systemd runs here: the setting wins, everywhere.
  {
    const d = await start('cgroupfs', { cgroupDriver: 'cgroupfs', systemdRuntimeDir: SYSTEMD_DIR, dbusAddress: address });
    const { mismatch, afterMismatch } = await refuseSystemdStyle(d);
    const p = pod('db', 'cgroupfs');
    const boot = await bootAndTearDown(d, p, async (id, pid) => ({
      unitsWhileRunning: await kataUnits(),
      files: await v1LimitFiles(CGROUP_ROOT, `${p.cgroupParent}/kata-ts-${id}`),
      dirs: await dirsPresent(CGROUP_ROOT, `${p.cgroupParent}/kata-ts-${id}`),
      pid,
    }));
    out.cgroupfs = {
      ...(await advertised(d)),
      cgroupParent: p.cgroupParent,
      mismatch,
      afterMismatch,
      boot,
      afterRemoveDirs: {
        leaf: 'id' in boot ? await dirsPresent(CGROUP_ROOT, `${p.cgroupParent}/kata-ts-${boot.id}`) : null,
        kubepods: await dirsPresent(CGROUP_ROOT, 'kubepods'),
      },
      placements: await placementsLogged(d),
    };
    await d.stop();
  }

  // auto without the systemd directory: cgroupfs detected; an attempt cut short after placement.
  {
    const d = await start('auto-nosd', {
      cgroupDriver: 'auto',
      systemdRuntimeDir: path.join(work, 'no-such-systemd-dir'),
      dbusAddress: address,
      hypervisor: { readyTimeoutMs: 1 },
    });
    const { mismatch, afterMismatch } = await refuseSystemdStyle(d);
    const p = pod('cut-short', 'cgroupfs');
    const attempt = await outcome(d.cri.runtime.RunPodSandbox({ config: p.config, runtime_handler: 'kata-ts' }));
    out.autoNoSystemd = {
      ...(await advertised(d)),
      cgroupParent: p.cgroupParent,
      mismatch,
      afterMismatch,
      attempt,
      placements: await placementsLogged(d),
      after: { ...(await hostTraces(d)), kubepods: await dirsPresent(CGROUP_ROOT, 'kubepods') },
    };
    await d.stop();
  }
  out.finalUnits = await kataUnits();
  out.qemuLeft = pidsMentioning('qemu-system');
}

try {
  await main();
} catch (err) {
  out.fatal = String((err as Error)?.stack ?? err);
  // For the outer test's failure message: the end of each daemon's log.
  out.daemonLogTails = await Promise.all(daemons.map(async (d) => ({ dir: d.dir, tail: (await d.logLines()).slice(-15) })));
} finally {
  for (const d of daemons) await d.stop().catch(() => undefined);
  await fsp.writeFile(process.env.KATA_TS_RESULT as string, JSON.stringify(out, null, 1));
}
