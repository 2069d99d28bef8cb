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
import { vmmPidsMax } from '../../cgroups/index.js';
import { errnoCode, errorMessage, internal } from '../../common/errors.js';
import { chownSocketNoFollow } from '../../common/nofollow.js';
import { startVirtiofsd, startVm, type VirtiofsdProcess, type VmmIdentity, type VmProcess } from '../../hypervisor/index.js';
import { netnsPathOf, type PodNetworkRecord, type PodNetworks } from '../../network/index.js';
import { RollbackSteps } from '../rollback.js';
import { bootGuest } from './boot.js';
import type { CreateDeps, CreatedSandbox, SandboxLaunchers, SandboxPreparation, SandboxRun, SwtpmHandle } from './create-types.js';
import { leaseOwnerOf, VmmIdentities } from './identities.js';
import { buildJail, releaseJail } from './jail.js';
import { sandboxTpmSocketDir } from './paths.js';
import { planWithMac } from './prepare.js';
import { prepareSharedDir, releaseSharedMounts, removeWorkDir } from './shared-dir.js';
import { restrictSocketModes } from './socket-modes.js';
import { startPodTpm, writePodInitdata } from './tpm.js';
import { startSwtpmProcess, swtpmJailSpecOf } from './tpm-launcher.js';

const REAL_LAUNCHERS: SandboxLaunchers = {
  startVm,
  startVirtiofsd,
  startSwtpm: startSwtpmProcess,
  swtpmJailSpec: swtpmJailSpecOf,
  prepareSharedDir,
  releaseSharedMounts,
  buildJail,
  releaseJail,
};

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
    const identity = await confine(run);
    if (prep.network !== null) await attachNetwork(run, prep.network.networks, prep.network.record, identity);
    const virtiofsd = prep.layout.withAgent ? await startSharedFs(run, identity) : undefined;
    const swtpm = await startPodTpm(run, identity);
    await writePodInitdata(run);
    if (identity !== undefined) await makeJail(run, identity);
    const vm = await launchVm(run, identity, [virtiofsd, swtpm]);
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
export async function makeWorkDir(run: SandboxRun): Promise<void> {
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
 * How QEMU will run, recorded before anything is started for it. Confined: an identity leased from
 * the node's range (released by the undo, or at RemovePodSandbox), and the VMM dir it owns (0700),
 * where its sockets and console go. Returns the identity, undefined when QEMU runs as root.
 */
async function confine(run: SandboxRun): Promise<VmmIdentity | undefined> {
  const { layout, req } = run.prep;
  const { vmm } = run.record.plan;
  const base = { seccomp: vmm.seccomp, optOutReason: vmm.optOutReason };
  if (!layout.confined) {
    run.record.confinement = { ...base, identity: null, jailDir: null, vmmDir: null };
    await run.persist();
    return undefined;
  }
  const identities = run.deps.identities ?? new VmmIdentities(run.deps.config.hypervisor.vmmIdentities, run.log);
  const owner = leaseOwnerOf(run.deps.store, req.id);
  const identity = await identities.acquire(owner);
  run.undo.push('release the VMM identity', () => identities.release(identity.uid, owner));
  run.record.confinement = {
    ...base,
    identity: { ...identity, lease: identities.leaseFile(identity.uid) },
    jailDir: layout.jailDir,
    vmmDir: layout.vmmDir,
  };
  await run.persist();
  // Inside the work dir: removed with it.
  await fsp.mkdir(layout.vmmDir, { mode: 0o700 });
  await fsp.chown(layout.vmmDir, identity.uid, identity.gid);
  run.log.info({ uid: identity.uid, gid: identity.gid, seccomp: vmm.seccomp }, 'VMM identity taken');
  req.signal.throwIfAborted();
  return identity;
}

/**
 * The jail a confined QEMU is chrooted into (jail.ts): /usr, its device nodes (the pod's VFIO
 * groups among them, owned by its identity while the pod holds them), its VMM dir and guest files.
 */
async function makeJail(run: SandboxRun, identity: VmmIdentity): Promise<void> {
  const { layout, network, planInput } = run.prep;
  const { plan } = run.record;
  const { hypervisor, pcie } = run.deps.config;
  // Registered first: a half-made jail's mounts are released all the same (after QEMU is gone).
  run.undo.push('release the jail', () => run.launchers.releaseJail(layout.jailDir, run.log));
  const files = [hypervisor.kernelPath, hypervisor.initrdPath];
  if (hypervisor.guestImagePath !== null) files.push(hypervisor.guestImagePath);
  // A vtpm pod's firmware code (its vars copy is in the VMM dir) and swtpm's socket dir.
  const tee = plan.tee;
  if (tee?.firmware != null) files.push('ovmfCode' in tee.firmware ? tee.firmware.ovmfCode : tee.firmware.bios);
  if (tee?.initdataPath != null) files.push(tee.initdataPath);
  const dirs = tee?.tpm != null ? [sandboxTpmSocketDir(layout.workDir)] : [];
  if (path.isAbsolute(plan.qemu.binary)) files.push(plan.qemu.binary);
  await run.launchers.buildJail(
    {
      jailDir: layout.jailDir,
      vmmDir: layout.vmmDir,
      files,
      dirs,
      devices: {
        kvm: plan.qemu.accel.accel === 'kvm',
        tun: network !== null,
        vhostNet: planInput.nic?.vhost === true,
        vfioGroups: plan.pcie.topology.groups.map((g) => g.group),
        vfioFunctions: plan.pcie.topology.functions.map((f) => ({ bdf: f.bdf, group: f.group })),
        devRoot: pcie.devRoot,
      },
    },
    identity,
  );
  run.prep.req.signal.throwIfAborted();
}

/**
 * Namespace, CNI ADD, TAP (a joined namespace: the TAP only; made for the confined QEMU's
 * identity, which may then attach to it); then the plan again with the CNI interface's MAC.
 */
export async function attachNetwork(
  run: SandboxRun,
  networks: PodNetworks,
  net: PodNetworkRecord,
  identity: VmmIdentity | undefined,
): Promise<void> {
  // Registered first: teardown undoes what `net` records, so a half-made network goes all the same.
  // It runs once QEMU (which holds the TAP) is gone: QEMU's undo is registered later, so runs earlier.
  // A joined namespace is the caller's, CNI in it too: only the TAP wiring is undone.
  if (net.kind === 'joined') run.undo.push('unwire the joined network', () => networks.detach(net, run.persist, run.log));
  else run.undo.push('tear down the pod network', () => networks.teardown(net, run.persist, run.log));
  await networks.setup(net, run.persist, run.log, identity === undefined ? {} : { tapOwner: identity });
  // setup() records the MAC (linkInfo refuses an interface without one; a joined namespace's was
  // read at prepare): null here is a bug.
  if (net.mac === null) throw new Error('the pod network was set up without a MAC');
  run.record.plan = planWithMac(run.prep.planInput, net.mac);
  await run.persist();
  run.prep.req.signal.throwIfAborted();
}

/**
 * The shared dir's mount, then virtiofsd serving it; QEMU connects to virtiofsd as the client, so it
 * starts first. A confined QEMU gets the socket (in its VMM dir) for its identity.
 */
async function startSharedFs(run: SandboxRun, identity: VmmIdentity | undefined): Promise<VirtiofsdProcess> {
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
  if (identity !== undefined) await chownSocketNoFollow(layout.virtiofsSocket, identity.uid, identity.gid);
  run.prep.req.signal.throwIfAborted();
  return virtiofsd;
}

/**
 * QEMU, paused (-S), in the pod's network namespace when it has one, confined (in a mount
 * namespace pivot_rooted into its jail, as its identity) unless the handler opted out, placed in
 * its cgroup before it runs (placeVmm); its sockets made 0600.
 */
async function launchVm(run: SandboxRun, identity: VmmIdentity | undefined, companions: Companions): Promise<VmProcess> {
  const { layout, network, req } = run.prep;
  const { plan } = run.record;
  const started: { vm?: VmProcess } = {};
  const vm = await run.launchers.startVm({
    place: (pid) => placeVmm(run, pid, companions, started),
    qemuBinary: plan.qemu.binary,
    argv: plan.qemu.argv,
    workDir: layout.workDir,
    paths: layout.vmPaths,
    logger: run.log,
    qmpTimeoutMs: run.deps.config.hypervisor.qmpTimeoutMs,
    // A caller's namespace (the shim's) by a path this process can open (network/record.ts).
    ...(network === null ? {} : { netnsPath: netnsPathOf(network.record) }),
    ...(identity === undefined ? {} : { jail: { jailDir: layout.jailDir, identity, ...vfioMemlock(run) } }),
  });
  started.vm = vm;
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
  if (identity !== undefined) await restrictSocketModes(layout.vmmDir);
  req.signal.throwIfAborted();
  return vm;
}

/**
 * A confined QEMU with real VFIO devices pins the guest's memory for DMA without CAP_IPC_LOCK: its
 * RLIMIT_MEMLOCK must hold all of it (boot RAM and the virtio-mem headroom) plus room for ROMs.
 * Not for simulated devices (pcie.simulateVfioWith), which pin nothing.
 */
function vfioMemlock(run: SandboxRun): { memlockBytes?: number } {
  const { plan } = run.record;
  if (plan.pcie.topology.functions.length === 0 || run.deps.config.pcie.simulateVfioWith !== null) return {};
  return { memlockBytes: (run.record.shape.maxMemoryMiB + VFIO_MEMLOCK_SLACK_MIB) * 1024 * 1024 };
}

/** The processes placed in the pod's cgroup with QEMU: virtiofsd and a vtpm pod's swtpm. */
export type Companions = [VirtiofsdProcess | undefined, SwtpmHandle | undefined];

/** Locked memory beyond the guest's RAM a VFIO VMM may pin (option ROMs, the IOMMU's own mappings). */
const VFIO_MEMLOCK_SLACK_MIB = 64;

/**
 * Placed before QEMU runs (confined: the jailer waits for it; unconfined: QEMU is paused): no
 * guest instruction, and nothing a compromised QEMU could fork, runs outside the pod's budget and
 * pids.max, and virtiofsd (which serves the guest's file I/O), with its sandbox child, shares it.
 */
export async function placeVmm(run: SandboxRun, pid: number, companions: Companions, started: { vm?: VmProcess }): Promise<void> {
  const { cgroups } = run.deps;
  const [virtiofsd, swtpm] = companions;
  const extraPids = [...(virtiofsd?.pids() ?? []), ...(swtpm?.pids() ?? [])];
  const placement = await cgroups.place({
    sandboxId: run.prep.req.id,
    cgroupParent: run.prep.cgroupParent,
    pid,
    ...(extraPids.length === 0 ? {} : { extraPids }),
    limits: run.record.plan.sizing.host,
    // No iothreads in kata-ts's argv (src/hypervisor): vCPUs and the margin.
    pidsMax: vmmPidsMax(run.record.shape.maxVcpus, 0, run.deps.config.hypervisor.vmmPidsMargin),
  });
  // A cgroup is removed only once no process is left in it, so this undo ends QEMU and virtiofsd
  // first; their own undo steps, which come after it, then find them gone. (A start that fails
  // after this point has ended its process already: startVm leaves none.)
  run.undo.push('remove cgroup', async () => {
    const { vm } = started;
    if (vm !== undefined) await run.undo.attempt('kill QEMU', () => vm.kill());
    if (virtiofsd !== undefined) await run.undo.attempt('stop virtiofsd', () => virtiofsd.stop(0));
    if (swtpm !== undefined) await run.undo.attempt('stop swtpm', () => swtpm.stop());
    await cgroups.remove(placement);
  });
  run.record.placement = placement;
  await run.persist();
  run.log.info(
    { pid, virtiofsdPid: virtiofsd?.pid, swtpmPid: swtpm?.pid, placement: cgroups.describe(placement) },
    'VMM placed before it runs',
  );
  const shortfallBytes = run.record.plan.sizing.overheadShortfallBytes;
  if (shortfallBytes !== undefined) {
    run.log.warn(
      { shortfallBytes, hostMemoryLimitBytes: run.record.plan.sizing.host.memoryLimitBytes },
      "the pod's overhead is short of what its VM costs beyond the containers' limits: where the kubelet limits the pod's cgroup, the VM can be OOM-killed first (kata-ts plan --overhead prints the RuntimeClass)",
    );
  }
}
