/**
 * RunPodSandbox's second half: carry out a SandboxPreparation. The effects, in order: the work
 * dir; the record in phase `creating` (written before anything a crash could leave behind is
 * made, so the next daemon start rolls such a sandbox back); the pod network (or the TAP into a
 * joined one); the shared dir and virtiofsd; QEMU, paused; its cgroup; the guest. Each effect
 * registers its undo on one RollbackSteps list right next to it; a failure runs them newest first
 * and rethrows.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, errorMessage, internal } from '../../common/errors.js';
import { startVirtiofsd, startVm, type VirtiofsdProcess, type VmProcess } from '../../hypervisor/index.js';
import type { PodNetworkRecord, PodNetworks } from '../../network/index.js';
import { RollbackSteps } from '../rollback.js';
import { bootGuest } from './boot.js';
import type { CreateDeps, CreatedSandbox, SandboxLaunchers, SandboxPreparation, SandboxRun } from './create-types.js';
import { planWithMac } from './prepare.js';
import { prepareSharedDir, releaseSharedMounts, removeWorkDir } from './shared-dir.js';
import { restrictSocketModes } from './socket-modes.js';

const REAL_LAUNCHERS: SandboxLaunchers = { startVm, startVirtiofsd, prepareSharedDir, releaseSharedMounts };

/** Carry out `prep`; on failure everything done is undone and the error rethrown. */
export async function executeSandbox(deps: CreateDeps, prep: SandboxPreparation): Promise<CreatedSandbox> {
  const { record, req } = prep;
  const log = req.logger;
  const run: SandboxRun = {
    deps,
    prep,
    record,
    log,
    undo: new RollbackSteps(log),
    launchers: deps.launchers ?? REAL_LAUNCHERS,
    persist: () => deps.store.put(record),
    startedMs: Date.now(),
  };
  try {
    await makeWorkDir(run);
    await deps.store.put(record);
    run.undo.push('delete record', () => deps.store.delete(req.id));
    req.signal.throwIfAborted();
    if (prep.network !== null) await attachNetwork(run, prep.network.networks, prep.network.record);
    const virtiofsd = prep.layout.withAgent ? await startSharedFs(run) : undefined;
    const vm = await launchVm(run);
    await placeVm(run, vm, virtiofsd);
    const agent = await bootGuest(run, vm);
    record.phase = 'running';
    record.state = 'SANDBOX_READY';
    await deps.store.put(record);
    log.info({ pid: vm.pid, guest: record.guest, guestPod: record.guestPod, bootMs: Date.now() - run.startedMs }, 'sandbox ready');
    return { record, vm, agent };
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'sandbox creation failed; rolling back');
    await run.undo.run();
    throw err;
  }
}

/** The work dir, 0700; one that exists already belongs to someone else and is left alone. */
async function makeWorkDir(run: SandboxRun): Promise<void> {
  const { workDir } = run.prep.layout;
  await fsp.mkdir(path.dirname(workDir), { recursive: true, mode: 0o700 });
  try {
    await fsp.mkdir(workDir, { mode: 0o700 });
  } catch (err) {
    if (errnoCode(err) === 'EEXIST') throw internal('SANDBOX_WORKDIR_EXISTS', `work directory ${workDir} already exists`);
    throw err;
  }
  run.undo.push('remove work dir', () => removeWorkDir(workDir, run.log));
}

/**
 * Namespace, CNI ADD, TAP (a joined namespace: the TAP only); then the plan again with the CNI
 * interface's MAC.
 */
async function attachNetwork(run: SandboxRun, networks: PodNetworks, net: PodNetworkRecord): Promise<void> {
  // Registered first: teardown undoes what `net` records, so a half-made network goes all the same.
  // It runs once QEMU (which holds the TAP) is gone: QEMU's undo is registered later, so runs earlier.
  // A joined namespace is the caller's, CNI in it too: only the TAP wiring is undone.
  if (net.kind === 'joined') run.undo.push('unwire the joined network', () => networks.detach(net, run.persist, run.log));
  else run.undo.push('tear down the pod network', () => networks.teardown(net, run.persist, run.log));
  await networks.setup(net, run.persist, run.log);
  // setup() records the MAC (linkInfo refuses an interface without one; a joined namespace's was
  // read at prepare): null here is a bug.
  if (net.mac === null) throw new Error('the pod network was set up without a MAC');
  run.record.plan = planWithMac(run.prep.planInput, net.mac);
  await run.persist();
  run.prep.req.signal.throwIfAborted();
}

/** The shared dir's mount, then virtiofsd serving it; QEMU connects to virtiofsd as the client, so it starts first. */
async function startSharedFs(run: SandboxRun): Promise<VirtiofsdProcess> {
  const { layout } = run.prep;
  // Registered first: a half-made mount is released all the same.
  run.undo.push('unmount the shared dir', () => run.launchers.releaseSharedMounts(layout.sharedDir, run.log));
  await run.launchers.prepareSharedDir(layout.sharedDir);
  const virtiofsd = await run.launchers.startVirtiofsd({
    binary: run.deps.config.hypervisor.virtiofsdBinary,
    socketPath: layout.virtiofsSocket,
    sourceDir: layout.sharedDir,
    logFile: layout.virtiofsdLog,
    logger: run.log,
  });
  run.undo.push('stop virtiofsd', () => virtiofsd.stop(0));
  run.record.virtiofsd = { pid: virtiofsd.pid, startTimeTicks: virtiofsd.startTimeTicks, socketPath: layout.virtiofsSocket };
  await run.persist();
  run.prep.req.signal.throwIfAborted();
  return virtiofsd;
}

/** QEMU, paused (-S), in the pod's network namespace when it has one; its sockets made 0600. */
async function launchVm(run: SandboxRun): Promise<VmProcess> {
  const { layout, network, req } = run.prep;
  const { plan } = run.record;
  const vm = await run.launchers.startVm({
    qemuBinary: plan.qemu.binary,
    argv: plan.qemu.argv,
    workDir: layout.workDir,
    paths: layout.vmPaths,
    logger: run.log,
    qmpTimeoutMs: run.deps.config.hypervisor.qmpTimeoutMs,
    ...(network === null ? {} : { netnsPath: network.record.netnsPath }),
  });
  run.undo.push('kill QEMU', () => vm.kill());
  run.record.vmm = {
    pid: vm.pid,
    startTimeTicks: vm.startTimeTicks,
    workDir: layout.workDir,
    ...layout.vmPaths,
    ...(layout.withAgent ? { agentSocket: layout.agentSocket, virtiofsSocket: layout.virtiofsSocket } : {}),
  };
  await run.persist();
  await restrictSocketModes(layout.workDir);
  req.signal.throwIfAborted();
  return vm;
}

/**
 * Placed while still paused: no guest instruction runs outside the pod's budget, and virtiofsd
 * (which serves the guest's file I/O) shares that budget.
 */
async function placeVm(run: SandboxRun, vm: VmProcess, virtiofsd: VirtiofsdProcess | undefined): Promise<void> {
  const { cgroups } = run.deps;
  const placement = await cgroups.place({
    sandboxId: run.prep.req.id,
    cgroupParent: run.prep.cgroupParent,
    pid: vm.pid,
    ...(virtiofsd === undefined ? {} : { extraPids: [virtiofsd.pid] }),
    limits: run.record.plan.sizing.host,
  });
  // A cgroup is removed only once no process is left in it, so this undo ends QEMU and virtiofsd
  // first; their own undo steps, which come after it, then find them gone.
  run.undo.push('remove cgroup', async () => {
    await run.undo.attempt('kill QEMU', () => vm.kill());
    if (virtiofsd !== undefined) await run.undo.attempt('stop virtiofsd', () => virtiofsd.stop(0));
    await cgroups.remove(placement);
  });
  run.record.placement = placement;
  await run.persist();
  run.log.info({ pid: vm.pid, virtiofsdPid: virtiofsd?.pid, placement: cgroups.describe(placement) }, 'VMM placed; resuming the VM');
}
