/**
 * A pooled VM becomes a pod's (docs/pool.md#claim): its work dir renamed to the sandbox's, its
 * record replaced by the sandbox record, then what a cold boot puts on the command line added
 * while it runs: CNI ADD in its namespace and the TAP, the NIC hot-plugged with CNI's MAC,
 * virtiofsd on the pod's shared dir and its device hot-plugged, the VMM (and virtiofsd) moved
 * into the pod's cgroup at normal priority (the VMM's cgroup in the pool's then removed) and grown
 * to the planned shape, then CreatePod (which mounts the share) and ConfigureNetwork. Every step
 * registers its undo like executeSandbox's; a failure runs them all (the VM is discarded, nothing
 * is left) and rethrows.
 */

import { promises as fsp } from 'node:fs';
import type { AgentClient } from '../../agent-client/index.js';
import { vmmPidsMax } from '../../cgroups/index.js';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { chownSocketNoFollow } from '../../common/nofollow.js';
import {
  type GuestReport,
  plugNic,
  plugSharedFs,
  plugVcpus,
  setVirtioMemSize,
  startVirtiofsd,
  type VirtiofsdProcess,
  type VmProcess,
  virtioMemPluggedMiB,
} from '../../hypervisor/index.js';
import { deleteNetns } from '../../network/index.js';
import { RollbackSteps } from '../rollback.js';
import { POD_SHM_SIZE_BYTES } from '../sandbox/boot.js';
import type { CreateDeps, CreatedSandbox, SandboxPreparation } from '../sandbox/create-types.js';
import { leaseOwnerOf, type VmmIdentities } from '../sandbox/identities.js';
import { releaseJail } from '../sandbox/jail.js';
import { configureGuestNetwork } from '../sandbox/network.js';
import { sandboxVmRoot } from '../sandbox/paths.js';
import { planWithMac } from '../sandbox/prepare.js';
import { prepareSharedDir, releaseSharedMounts, removeWorkDir } from '../sandbox/shared-dir.js';
import type { RecordStore } from '../store.js';
import { type ClaimPlan, planClaim } from './plan.js';
import type { PooledVmRecord } from './record.js';
import { type PooledVm, reniceProcess } from './vm.js';

/** The nice value a claimed VM's threads get back: the pod's cgroup decides its share from then on. */
const CLAIMED_NICE = 0;

export interface ClaimInput {
  deps: CreateDeps;
  prep: SandboxPreparation;
  pooled: PooledVm;
  identities: VmmIdentities;
  poolStore: RecordStore<PooledVmRecord>;
}

export async function claimPooledVm(input: ClaimInput, log: Logger): Promise<CreatedSandbox> {
  const { deps, prep, pooled, identities, poolStore } = input;
  const { req, layout } = prep;
  const { record } = prep;
  const { vm, agent } = pooled;
  const pool = pooled.record;
  const undo = new RollbackSteps(log);
  const persist = () => deps.store.put(record);
  const started = Date.now();
  // The claim's own budget: a stalled pooled VM hands the pod to a cold boot with time to spare.
  const budgetMs = Math.min(req.readyTimeoutMs, deps.config.pool.claimTimeoutMs);
  // Waits (the guest's report, virtio-mem, the agent) end with it; it is checked between steps; a
  // QMP command already sent ends on its own timeout (QmpConnection's, 10 s).
  const budget = AbortSignal.timeout(budgetMs);
  const signal = AbortSignal.any([req.signal, budget]);
  const remainingMs = () => Math.max(1, budgetMs - (Date.now() - started));
  const overBudget = () => budget.aborted || Date.now() - started >= budgetMs;
  const budgetSpent = `the claim ran past its budget of ${budgetMs} ms (pool.claimTimeoutMs, at most hypervisor.readyTimeoutMs)`;
  // Between steps: the request's own abort as it is, the budget's as a claim failure naming it.
  const checkBudget = () => {
    req.signal.throwIfAborted();
    if (overBudget()) throw new Error(budgetSpent);
  };
  const claim = planClaim(record.plan, { ...pool.shape, hugepages: [], kernelParams: [] }, prep.network !== null);
  if (pool.vmm === null) throw new Error('a ready pooled VM without a VMM record');
  const poolVmm = pool.vmm;
  // A failed claim hands the pod to a cold boot: the record as prepared, nothing of the pooled VM's.
  const prepared = structuredClone(record);
  // The prepared network record itself (the cold boot sets it up and records its steps through it).
  const preparedNetwork = record.network;
  try {
    // Whatever fails from here on, the pooled VM goes: QEMU first (its undo runs last-registered-first),
    // then its cgroup in the pool's (gone already once step 5 moved QEMU out; the pool's own stays).
    const poolCgroup = pool.placement === null ? null : { ...pool.placement, createdParents: [] };
    if (poolCgroup !== null) undo.push('remove the pool cgroup', () => deps.cgroups.remove(poolCgroup));
    undo.push('close the agent client', async () => agent.close());
    undo.push('kill QEMU', () => vm.kill());
    // 1. The pooled VM's files become the sandbox's: one rename on the state dir's filesystem.
    await fsp.mkdir(sandboxVmRoot(deps.config.stateDir), { recursive: true, mode: 0o700 });
    await fsp.rename(pool.workDir, layout.workDir);
    // QEMU (chrooted in the jail under it when confined) goes before its files.
    const killFirst = () => undo.attempt('kill QEMU', () => vm.kill());
    undo.push('remove work dir', async () => {
      await killFirst();
      await removeWorkDir(layout.workDir, log);
    });
    // 2. The sandbox record (phase creating) owns it all; then the pool's record goes.
    record.origin = {
      kind: 'pool',
      poolVmId: pool.id,
      pooledShape: {
        vcpus: pool.shape.vcpus,
        memoryMiB: pool.shape.memoryMiB,
        maxVcpus: pool.shape.maxVcpus,
        maxMemoryMiB: pool.shape.maxMemoryMiB,
      },
    };
    const { vmm } = record.plan;
    const base = { seccomp: vmm.seccomp, optOutReason: vmm.optOutReason };
    record.confinement =
      pool.confinement === null
        ? { ...base, identity: null, jailDir: null, vmmDir: null }
        : {
            ...base,
            identity: { uid: pool.confinement.uid, gid: pool.confinement.gid, lease: identities.leaseFile(pool.confinement.uid) },
            jailDir: layout.jailDir,
            vmmDir: layout.vmmDir,
          };
    record.vmm = {
      pid: vm.pid,
      startTimeTicks: vm.startTimeTicks,
      workDir: layout.workDir,
      ...layout.vmPaths,
      agentSocket: layout.agentSocket,
      virtiofsSocket: layout.virtiofsSocket,
    };
    await persist();
    undo.push('delete record', () => deps.store.delete(req.id));
    if (pool.confinement !== null) {
      const { uid } = pool.confinement;
      const owner = leaseOwnerOf(deps.store, req.id);
      await identities.transfer(uid, leaseOwnerOf(poolStore, pool.id), owner);
      undo.push('release the VMM identity', () => identities.release(uid, owner));
      undo.push('release the jail', async () => {
        await killFirst();
        await releaseJail(layout.jailDir, log);
      });
    }
    await poolStore.delete(pool.id);
    // 3. The pod network in the namespace QEMU already runs in.
    if (prep.network !== null && prep.network.record.kind === 'cni' && pool.network !== null) {
      // A copy: the prepared one stays the cold boot's (its own namespace) if the claim fails.
      const net = structuredClone(prep.network.record);
      const { networks } = prep.network;
      net.netnsName = pool.network.netnsName;
      net.netnsPath = pool.network.netnsPath;
      net.attachment = { ...net.attachment, netnsPath: pool.network.netnsPath };
      record.network = net;
      await persist();
      undo.push('tear down the pod network', () => networks.teardown(net, persist, log));
      const tapOwner = pool.confinement === null ? undefined : { uid: pool.confinement.uid, gid: pool.confinement.gid };
      await networks.setup(net, persist, log, { netnsMade: true, ...(tapOwner === undefined ? {} : { tapOwner }) });
      if (net.mac === null || net.mtu === null) throw new Error('the pod network was set up without a MAC');
      record.plan = planWithMac(prep.planInput, net.mac);
      await persist();
      await plugNic(vm.qmp, {
        tapName: net.tapName,
        mac: net.mac,
        vhost: prep.planInput.nic?.vhost === true,
        bus: claim.nic?.portId ?? '',
      });
    } else if (pool.network !== null) {
      const { netnsName } = pool.network;
      undo.push('delete netns', () => deleteNetns(netnsName));
    }
    checkBudget();
    // 4. The shared dir and virtiofsd on it; QEMU connects to it as a client (chardev-add).
    undo.push('unmount the shared dir', () => releaseSharedMounts(layout.sharedDir, log));
    await prepareSharedDir(layout.sharedDir);
    const virtiofsd: VirtiofsdProcess = await startVirtiofsd({
      binary: deps.config.hypervisor.virtiofsdBinary,
      socketPath: layout.virtiofsSocket,
      sourceDir: layout.sharedDir,
      logFile: layout.virtiofsdLog,
      logger: log,
    });
    undo.push('stop virtiofsd', () => virtiofsd.stop(0));
    record.virtiofsd = { pid: virtiofsd.pid, startTimeTicks: virtiofsd.startTimeTicks, socketPath: layout.virtiofsSocket };
    await persist();
    // In the VMM dir of a QEMU that runs: the socket itself, never a link QEMU put there.
    if (pool.confinement !== null) await chownSocketNoFollow(layout.virtiofsSocket, pool.confinement.uid, pool.confinement.gid);
    // Confined, QEMU sees its VMM dir at the pool's path still (its jail was built there).
    const qemuSocket = pool.confinement === null ? layout.virtiofsSocket : poolVmm.qemuVirtiofsSocket;
    await plugSharedFs(vm.qmp, qemuSocket, claim.sharedFs.portId);
    checkBudget();
    // 5. The pod's cgroup, at normal priority: from here the VM runs on the pod's budget.
    const placement = await deps.cgroups.place({
      sandboxId: req.id,
      cgroupParent: prep.cgroupParent,
      pid: vm.pid,
      extraPids: virtiofsd.pids(),
      limits: record.plan.sizing.host,
      pidsMax: vmmPidsMax(record.shape.maxVcpus, 0, deps.config.hypervisor.vmmPidsMargin),
    });
    undo.push('remove cgroup', async () => {
      await undo.attempt('kill QEMU', () => vm.kill());
      await undo.attempt('stop virtiofsd', () => virtiofsd.stop(0));
      await deps.cgroups.remove(placement);
    });
    record.placement = placement;
    await persist();
    // QEMU has left the pool's cgroup: its own there goes (the pool's stays for the refill).
    if (poolCgroup !== null) await deps.cgroups.remove(poolCgroup);
    reniceProcess(vm.pid, CLAIMED_NICE);
    checkBudget();
    // 6. Grown to the planned shape; 7. the pod in the guest (the agent mounts the hot-plugged
    // share) and its network.
    const budgetView: ClaimBudget = { remainingMs, signal, checkBudget };
    const steps = await growAndStartPod({ vm, agent, claim, record, prep, budget: budgetView }, log);
    record.phase = 'running';
    record.state = 'SANDBOX_READY';
    await persist();
    log.info({ pid: vm.pid, guest: record.guest, claimMs: Date.now() - started, poolVmId: pool.id, steps }, 'sandbox ready from the pool');
    return { record, vm, agent };
  } catch (caught) {
    const err =
      overBudget() && !req.signal.aborted && !errorMessage(caught).startsWith(budgetSpent)
        ? new Error(`${budgetSpent}: ${errorMessage(caught)}`)
        : caught;
    log.warn({ err: errorMessage(err) }, 'claiming the pooled VM failed; discarding it');
    await undo.run();
    // What only the pool held, if the claim stopped before the sandbox record took it over.
    await poolStore.delete(pool.id).catch(() => undefined);
    await removeWorkDir(pool.workDir, log).catch(() => undefined);
    if (pool.confinement !== null) {
      await identities.release(pool.confinement.uid, leaseOwnerOf(poolStore, pool.id)).catch(() => undefined);
      await releaseJail(pool.confinement.jailDir, log).catch(() => undefined);
    }
    // Its namespace (idempotent: the pod network's teardown removed it if the claim got that far).
    if (pool.network !== null) await deleteNetns(pool.network.netnsName).catch(() => undefined);
    restorePrepared(record, prepared, preparedNetwork);
    throw err;
  }
}

/**
 * A record put back as prepareSandbox made it (in place: the caller holds it), after a claim of a
 * pooled VM or a clone failed, so the next way (the pool, a cold boot) starts from it; its network
 * record is the prepared object itself, which the cold boot fills in.
 */
export function restorePrepared(
  record: SandboxPreparation['record'],
  prepared: SandboxPreparation['record'],
  network: SandboxPreparation['record']['network'],
): void {
  for (const key of Object.keys(record)) delete (record as unknown as Record<string, unknown>)[key];
  Object.assign(record, prepared, { network });
}

/**
 * What a running VM's claim waits against: the time left, the abort of the request or budget, and
 * the check made between steps (throws once either ran out).
 */
export interface ClaimBudget {
  remainingMs: () => number;
  signal: AbortSignal;
  checkBudget: () => void;
}

/** A guest's size as guest/init reports it. */
export type GuestSize = Pick<GuestReport, 'vcpus' | 'memoryKiB' | 'onlineMemoryKiB'>;

/**
 * Grows a running VM (a pooled one or a template's clone: both boot small with spare vCPUs and
 * virtio-mem headroom) to the planned shape: vCPUs hot-plugged, virtio-mem's requested size set,
 * then waits until the guest reports the vCPUs online and has plugged the memory. Answers the
 * guest's report (what the sandbox record's `guest` holds). A clone that needs no growth answers
 * `before` at once: its guest reports nothing until its size changes.
 */
export async function growToShape(
  vm: Pick<VmProcess, 'qmp' | 'waitForGuestReport'>,
  claim: Pick<ClaimPlan, 'addVcpus' | 'virtioMemMiB' | 'virtioMemMaxMiB'>,
  want: { vcpus: number },
  budget: ClaimBudget,
  before?: GuestSize,
): Promise<{ vcpus: number; memoryKiB: number }> {
  const { remainingMs, checkBudget } = budget;
  if (before !== undefined && claim.addVcpus === 0 && claim.virtioMemMiB === 0 && before.vcpus === want.vcpus) {
    // Nothing to grow, and the guest reports only a size that changed: its size is the one known.
    return { vcpus: before.vcpus, memoryKiB: before.memoryKiB };
  }
  if (claim.addVcpus > 0) await plugVcpus(vm.qmp, claim.addVcpus);
  if (claim.virtioMemMiB > 0) await setVirtioMemSize(vm.qmp, claim.virtioMemMiB, claim.virtioMemMaxMiB);
  // With the size before known, wait for the report that shows the plugged memory online too (a
  // report sent midway shows part of it); without, the first one with the planned vCPUs.
  const grown = (r: GuestReport): boolean =>
    r.vcpus === want.vcpus && (before === undefined || r.onlineMemoryKiB >= before.onlineMemoryKiB + claim.virtioMemMiB * 1024);
  const report = await vm.waitForGuestReport(grown, remainingMs());
  while (claim.virtioMemMiB > 0 && (await virtioMemPluggedMiB(vm.qmp)) < claim.virtioMemMiB) {
    checkBudget();
    if (remainingMs() <= 1) throw new Error(`the guest did not plug ${claim.virtioMemMiB} MiB of virtio-mem in time`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return { vcpus: report.vcpus, memoryKiB: report.memoryKiB };
}

/** How long each part of growAndStartPod took (ms from its start), for the log and the benches. */
export interface GrowAndStartTimes {
  /** The guest reported the planned vCPUs online and plugged the virtio-mem. */
  grownMs: number;
  /** CreatePod answered (the shared directory mounted, the pause process up). */
  podMs: number;
  /** The pod network configured in the guest (0 without one). */
  networkMs: number;
  /** ConfigureNetwork calls made (the NIC may not be probed yet on the first ones). */
  networkAttempts: number;
}

/**
 * A running VM (pooled or a template's clone) grown to the planned shape and the pod started in
 * its guest, the two overlapped: the hot-plugs are sent, then the guest onlines its vCPUs and
 * plugs memory (3 s of a 7 s claim under TCG, measured) while the agent makes the pod and
 * configures its network. Both must finish before the pod is ready, so a container never starts
 * in a VM smaller than planned; either failing fails the claim. Sets `record.guest`.
 */
export async function growAndStartPod(
  input: {
    vm: Pick<VmProcess, 'qmp' | 'waitForGuestReport'>;
    agent: AgentClient;
    claim: Pick<ClaimPlan, 'addVcpus' | 'virtioMemMiB' | 'virtioMemMaxMiB'>;
    record: SandboxPreparation['record'];
    prep: SandboxPreparation;
    budget: ClaimBudget;
    /** The guest's size before the claim when known apart from its reports (a clone's: its template's). */
    guestBefore?: GuestSize;
  },
  log: Logger,
): Promise<GrowAndStartTimes> {
  const { vm, agent, claim, record, prep, budget } = input;
  const started = Date.now();
  const times: GrowAndStartTimes = { grownMs: 0, podMs: 0, networkMs: 0, networkAttempts: 0 };
  const grow = growToShape(vm, claim, record.plan.sizing.vm, budget, input.guestBefore).then((guest) => {
    times.grownMs = Date.now() - started;
    return guest;
  });
  // Not left unobserved while the pod's start runs: its own await below reports it.
  grow.catch(() => undefined);
  await startGuestPod(agent, record, prep, budget, log, (step, attempts) => {
    if (step === 'pod') times.podMs = Date.now() - started;
    else {
      times.networkMs = Date.now() - started;
      times.networkAttempts = attempts;
    }
  });
  record.guest = await grow;
  return times;
}

/**
 * The pod in a grown VM's guest: CreatePod (the agent mounts the shared directory hot-plugged
 * before, virtio-fs or 9p), its pause process and shm recorded, then the pod network configured
 * when the record has one (the NIC was hot-plugged before). The caller persists the record.
 */
export async function startGuestPod(
  agent: AgentClient,
  record: SandboxPreparation['record'],
  prep: SandboxPreparation,
  budget: ClaimBudget,
  log: Logger,
  onStep?: (step: 'pod' | 'network', attempts: number) => void,
): Promise<void> {
  const { req } = prep;
  const pod = await agent.createPod(
    { podId: req.id, hostname: req.spec.hostname, shmSizeBytes: POD_SHM_SIZE_BYTES },
    { timeoutMs: budget.remainingMs(), signal: budget.signal },
  );
  if (!pod.sharedDirMounted) throw new Error('the guest did not mount the hot-plugged shared directory');
  record.guestPod = { pausePid: pod.pausePid, shmPath: pod.shmPath };
  onStep?.('pod', 1);
  if (record.network !== null) onStep?.('network', await configureWithRetry(agent, record, prep, budget, log));
}

/** The NIC was hot-plugged moments ago: the guest may not have probed it yet (the agent finds it by MAC). */
async function configureWithRetry(
  agent: AgentClient,
  record: SandboxPreparation['record'],
  prep: SandboxPreparation,
  budget: ClaimBudget,
  log: Logger,
): Promise<number> {
  const { remainingMs, signal } = budget;
  if (record.network === null) return 0;
  for (let attempt = 1; ; attempt++) {
    try {
      await configureGuestNetwork(agent, record.network, prep.req.spec, { timeoutMs: remainingMs(), signal });
      return attempt;
    } catch (err) {
      budget.checkBudget();
      if (remainingMs() <= 200 || attempt >= 50) throw err;
      log.debug({ attempt, err: errorMessage(err) }, 'guest NIC not ready yet');
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}
