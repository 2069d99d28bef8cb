import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import { errnoCode, errorMessage, isReason, precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { poolCgroupParent } from '../../config/defaults.js';
import type { AgentKeepaliveConfig } from '../../config/types.js';
import { attachVm, isSameLiveProcess, type VmProcess } from '../../hypervisor/index.js';
import { cgroupParentOf } from '../spec/sandbox.js';
import { reopenAgentClient } from './agent.js';
import { reassertIdentity, releaseIdentity } from './identities.js';
import { networksFor } from './network.js';
import { killAndWait, qemuPidsUsing, swtpmPidsUsing, virtiofsdPidsUsing } from './orphans.js';
import { poolVmWorkDir, sandboxWorkDir } from './paths.js';
import { pausedHold, recoverPausedVm } from './pause.js';
import type { SandboxRecord } from './record.js';
import { removeWorkDir } from './shared-dir.js';
import { checkPodTpm, stopPodTpm } from './tpm.js';
import { cgroupsFor, type LiveSandbox, type SandboxManagerDeps } from './types.js';
import { stopVirtiofsd } from './virtiofsd.js';

type RecoverDeps = SandboxManagerDeps;

/**
 * At daemon start: load every sandbox record and reconcile it with the host. A running VM is
 * re-attached (same pid, same start time, its QMP socket) and stays READY; a VM that is gone makes
 * its sandbox NOTREADY. A creation cut short by a crash is rolled back completely. No VM is ever
 * started, restarted or duplicated here.
 */
export async function recoverSandboxes(deps: RecoverDeps): Promise<LiveSandbox[]> {
  const log = deps.logger.child({ component: 'recovery' });
  const { records } = await deps.store.load();
  const out: LiveSandbox[] = [];
  for (const record of records) {
    const slog = log.child({ sandboxId: record.id });
    try {
      if (record.phase === 'creating') {
        await rollBackInterruptedCreate(deps, record, slog);
        continue;
      }
      // The record holds the VMM's identity (a confined QEMU, running or not): so does its lease.
      await reassertIdentity(deps, record, slog);
      const vm = record.state === 'SANDBOX_READY' ? await reattach(deps, record, slog) : undefined;
      if (vm === undefined) await retryNetworkDetach(deps, record, slog);
      // swtpm serves its QEMU only: found again beside a running VM, ended beside a gone one.
      if (vm === undefined) await stopPodTpm(record, deps.config.stateDir, slog);
      else checkPodTpm(record, slog);
      out.push({
        record,
        vm,
        agent: vm === undefined ? undefined : reconnectAgent(record, slog, deps.config.hypervisor.agentKeepalive),
        stopping: false,
      });
    } catch (err) {
      // A sandbox that cannot be reconciled is kept, NOTREADY, so Stop/Remove can still clean it.
      slog.error({ err: errorMessage(err) }, 'sandbox could not be recovered; marked NOTREADY');
      record.state = 'SANDBOX_NOTREADY';
      out.push({ record, vm: undefined, agent: undefined, stopping: false });
    }
  }
  await removeStrayWorkDirs(deps, new Set(records.map((r) => r.id)), log);
  log.info({ sandboxes: out.length, ready: out.filter((s) => s.record.state === 'SANDBOX_READY').length }, 'sandboxes recovered');
  return out;
}

/** A claimed pooled VM's QEMU names its QMP socket under the pool's work dir it was booted in (docs/pool.md). */
function argvQmpSocket(deps: RecoverDeps, record: SandboxRecord): { argvQmpSocket?: string } {
  const { vmm, origin } = record;
  if (vmm === null || origin?.kind !== 'pool') return {};
  const rel = path.relative(vmm.workDir, vmm.qmpSocket);
  if (rel.startsWith('..') || path.isAbsolute(rel)) return {};
  return { argvQmpSocket: path.join(poolVmWorkDir(deps.config.stateDir, origin.poolVmId), rel) };
}

async function reattach(deps: RecoverDeps, record: SandboxRecord, log: Logger): Promise<VmProcess | undefined> {
  const vmm = record.vmm;
  if (vmm === null) throw new Error('a READY sandbox record without a VMM');
  let vm: VmProcess;
  try {
    await checkVmmSockets(record);
    vm = await attachVm({
      pid: vmm.pid,
      startTimeTicks: vmm.startTimeTicks,
      qmpSocket: vmm.qmpSocket,
      ...argvQmpSocket(deps, record),
      readySocket: vmm.readySocket,
      qemuLog: vmm.qemuLog,
      consoleLog: vmm.consoleLog,
      logger: log,
      qmpTimeoutMs: deps.config.hypervisor.qmpTimeoutMs,
    });
  } catch (err) {
    if (isReason(err, 'VM_PROCESS_GONE')) {
      log.warn({ pid: vmm.pid }, 'VM ended while kata-ts was down; sandbox is NOTREADY');
      record.state = 'SANDBOX_NOTREADY';
      record.phase = 'stopped';
      record.exit = { at: new Date().toISOString(), code: null, signal: null, reason: 'gone-while-down', logTail: '' };
      record.guestPod = null;
      // virtiofsd ends with QEMU's connection; one that did not is stopped.
      await stopVirtiofsd(record, log);
      record.virtiofsd = null;
      await deps.store.put(record);
      return undefined;
    }
    throw err;
  }
  const status = await vm.qmp.queryStatus();
  // A paused pod's VM is stopped on purpose: it stays READY (and paused), see pause.ts.
  if (record.paused != null && (await recoverPausedVm(record, vm, status.status, log))) return vm;
  if (status.status !== 'running') {
    // Paused, shut down or panicked: not a pod that serves; StopPodSandbox will end it.
    log.warn({ pid: vm.pid, status: status.status }, 're-attached VM is not running; sandbox is NOTREADY');
    record.state = 'SANDBOX_NOTREADY';
    await deps.store.put(record);
  } else {
    log.info({ pid: vm.pid }, 'VM re-attached');
  }
  return vm;
}

/**
 * A confined QEMU owns its VMM dir: before the daemon connects to the sockets in it again (QMP,
 * ready, the agent's port), each must still be a socket of the VMM's uid, not a link the VMM put
 * in its place to some other socket of the host. A VM whose sockets fail this is not re-attached
 * (NOTREADY; StopPodSandbox ends it).
 */
export async function checkVmmSockets(record: Pick<SandboxRecord, 'vmm' | 'confinement'>): Promise<void> {
  const uid = record.confinement?.identity?.uid;
  const vmm = record.vmm;
  if (uid === undefined || vmm === null) return;
  for (const socket of [vmm.qmpSocket, vmm.readySocket, vmm.agentSocket]) {
    if (socket === undefined) continue;
    const st = await fsp.lstat(socket).catch(() => undefined);
    // Gone: attachVm says so with its own error.
    if (st !== undefined && (!st.isSocket() || st.uid !== uid)) {
      throw precondition('VMM_SOCKET_REPLACED', `${socket} is no longer a socket of the confined VMM (uid ${uid}).`, {
        details: { socket, uid: st.uid, socketKind: st.isSymbolicLink() ? 'symlink' : 'other' },
      });
    }
  }
}

/**
 * The agent of a re-attached VM: a new session to the same agent (which kept running), opened in
 * the background; virtiofsd is only checked (it serves QEMU, not us: nothing to re-attach to).
 */
function reconnectAgent(record: SandboxRecord, log: Logger, keepalive: AgentKeepaliveConfig): AgentClient | undefined {
  const v = record.virtiofsd;
  if (v !== null && !isSameLiveProcess(v.pid, v.startTimeTicks)) {
    log.error({ pid: v.pid }, 'virtiofsd is gone: the guest has lost its shared directory');
  }
  const socket = record.vmm?.agentSocket;
  return socket === undefined ? undefined : reopenAgentClient(socket, log, pausedHold(record), keepalive);
}

async function rollBackInterruptedCreate(deps: RecoverDeps, record: SandboxRecord, log: Logger): Promise<void> {
  const workDir = sandboxWorkDir(deps.config.stateDir, record.id);
  log.warn('RunPodSandbox was interrupted by a restart; rolling it back');
  if (record.vmm !== null) {
    if (isSameLiveProcess(record.vmm.pid, record.vmm.startTimeTicks)) await killAndWait(record.vmm.pid);
  } else {
    // The crash came between spawning QEMU and recording its pid: find it by its work dir.
    for (const pid of await qemuPidsUsing(workDir)) await killAndWait(pid);
  }
  // virtiofsd: by its record, or (crash before that was written) by its socket in the work dir.
  if (record.virtiofsd !== null) {
    if (isSameLiveProcess(record.virtiofsd.pid, record.virtiofsd.startTimeTicks)) await killAndWait(record.virtiofsd.pid);
  }
  for (const pid of await virtiofsdPidsUsing(workDir)) await killAndWait(pid);
  // swtpm: by its record, or (crash before that was written) by its socket or state in the work dir.
  await stopPodTpm(record, deps.config.stateDir, log);
  for (const pid of await swtpmPidsUsing(workDir)) await killAndWait(pid);
  // The pod network as far as it was recorded: TAP, CNI DEL (safe after a partial ADD), namespace;
  // of a joined namespace (the caller's), the TAP only.
  if (record.network !== null) await networksFor(deps).teardown(record.network, () => deps.store.put(record), log);
  const driver = cgroupsFor(deps, record.placement?.driver ?? record.cgroupDriver);
  if (record.placement !== null) {
    await driver.remove(record.placement);
  } else if (record.vmm !== null) {
    // The crash may have come after the VMM was placed but before that was recorded.
    const cgroupParent = cgroupParentOf(record.spec);
    await driver.remove(await driver.placementFor(record.id, cgroupParent));
  }
  // A claim cut short (docs/pool.md): QEMU's cgroup in the pool's, if the claim had not removed it yet.
  if (record.origin?.kind === 'pool') {
    await driver.remove(await driver.placementFor(record.origin.poolVmId, poolCgroupParent(deps.config.pool, driver.name)));
  }
  // The shared directory's and the jail's mounts go before anything below them is deleted.
  await removeWorkDir(workDir, log);
  await deps.store.delete(record.id);
  // Last, as RemovePodSandbox does; by the record, or by the lease's owner when the crash came
  // before the record named the identity.
  await releaseIdentity(deps, record, log);
}

/**
 * A sandbox whose VM is gone but whose CNI attachment or TAP wiring was not released (a crash
 * between the VM's end and CNI DEL): undone again from the record (a joined namespace: the TAP
 * only). A failure is logged; StopPodSandbox retries it.
 */
async function retryNetworkDetach(deps: RecoverDeps, record: SandboxRecord, log: Logger): Promise<void> {
  const net = record.network;
  if (net === null || (!(net.kind === 'cni' && net.cniAttached) && !net.tapWired)) return;
  if (record.vmm !== null && isSameLiveProcess(record.vmm.pid, record.vmm.startTimeTicks)) return;
  try {
    await networksFor(deps).detach(net, () => deps.store.put(record), log);
    log.info({ netns: net.netnsPath }, 'pod network detach retried for a sandbox whose VM is gone');
  } catch (err) {
    log.error({ err: errorMessage(err) }, 'CNI DEL retry failed; StopPodSandbox will retry it');
  }
}

/** Work dirs without a record are leftovers of a crash before the first write: remove them. */
async function removeStrayWorkDirs(deps: RecoverDeps, known: Set<string>, log: Logger): Promise<void> {
  const vmRoot = path.join(deps.config.stateDir, 'vm');
  let entries: string[];
  try {
    entries = await fsp.readdir(vmRoot);
  } catch (err) {
    // No vm/ yet is no stray work dir; anything else (EACCES, EIO) must not pass for "none".
    if (errnoCode(err) === 'ENOENT') return;
    throw err;
  }
  const knownPrefixes = new Set([...known].map((id) => path.basename(sandboxWorkDir(deps.config.stateDir, id))));
  for (const entry of entries) {
    if (knownPrefixes.has(entry)) continue;
    const dir = path.join(vmRoot, entry);
    for (const pid of await qemuPidsUsing(dir)) await killAndWait(pid);
    for (const pid of await virtiofsdPidsUsing(dir)) await killAndWait(pid);
    for (const pid of await swtpmPidsUsing(dir)) await killAndWait(pid);
    await removeWorkDir(dir, log);
    log.warn({ dir }, 'removed a work directory without a sandbox record');
  }
}
