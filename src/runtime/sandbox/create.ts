import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import type { AgentClient } from '../../agent-client/index.js';
import type { CgroupDriver, PlacementRecord } from '../../cgroups/index.js';
import { raceAbort } from '../../common/abort.js';
import { errnoCode, errorMessage, internal, precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import type { ResolvedHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import { checkGuestAssets, startVirtiofsd, startVm, type VirtiofsdProcess, type VmPaths, type VmProcess } from '../../hypervisor/index.js';
import type { PodNetworkRecord, PodNetworks } from '../../network/index.js';
import { getKubeletPodResources, type KubeletPodResources, type PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import { requestAbortReason } from '../deadline.js';
import type { RuntimeFacts } from '../facts.js';
import { planSandbox, type SandboxPlanInput } from '../plan.js';
import { cgroupParentOf, type SandboxSpec } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import { connectAgentClient } from './agent.js';
import { configureGuestNetwork, PLANNED_MAC, podNetworkRequest } from './network.js';
import { sandboxArgvPaths, sandboxSharedDir, sandboxVmPaths, sandboxWorkDir, vmNameFor } from './paths.js';
import { nowNs, type SandboxRecord } from './record.js';
import { prepareSharedDir, releaseSharedMounts, removeWorkDir } from './shared-dir.js';
import { restrictSocketModes } from './socket-modes.js';

/** The pod's /dev/shm in the guest: what the kubelet and containerd give a pod (the CRI has no size for it). */
export const POD_SHM_SIZE_BYTES = 64 * 1024 * 1024;

export interface CreateDeps {
  /** How to reach a guest's agent (tests replace it); connectAgentClient unless given. */
  connectAgent?: typeof connectAgentClient;
  config: KataConfig;
  facts: RuntimeFacts;
  store: RecordStore<SandboxRecord>;
  cgroups: CgroupDriver;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
  /** Pod networking (network.mode "cni"); absent: pod VMs get no NIC. */
  network?: PodNetworks;
}

export interface CreateRequest {
  id: string;
  spec: SandboxSpec;
  runtimeHandler: string;
  handler: ResolvedHandler;
  logger: Logger;
  signal: AbortSignal;
  /** How long the guest may take to signal ready (already bounded by the caller's deadline). */
  readyTimeoutMs: number;
}

/**
 * RunPodSandbox, executed: plan, then start QEMU paused, place it in the pod's cgroup, resume,
 * wait for the guest, persist. The record is written before QEMU starts (phase `creating`) so a
 * daemon crash at any point is rolled back by the next start. Any failure here rolls back what
 * was done (QEMU killed, cgroup removed, record and work dir deleted) and rethrows.
 */
export async function createSandbox(
  deps: CreateDeps,
  req: CreateRequest,
): Promise<{ record: SandboxRecord; vm: VmProcess; agent: AgentClient | undefined }> {
  const { config } = deps;
  const log = req.logger;
  const { spec } = req;
  const cgroupParent = cgroupParentOf(spec);
  deps.cgroups.validateParent(cgroupParent);
  const assets = await checkGuestAssets({
    kernelPath: config.hypervisor.kernelPath,
    initrdPath: config.hypervisor.initrdPath,
    guestImagePath: config.hypervisor.guestImagePath,
  });
  if (!assets.ok) throw precondition('GUEST_ASSETS_MISSING', assets.message);

  const workDir = sandboxWorkDir(config.stateDir, req.id);
  const allPaths = sandboxVmPaths(workDir);
  // The guest image carries the agent: without one the VM runs no containers, so it gets neither
  // the agent's port nor virtio-fs (a VM shaped as before the agent existed).
  const withAgent = config.hypervisor.guestImagePath !== null;
  const { agentSocket, virtiofsSocket, virtiofsdLog, ...basePaths } = allPaths;
  const paths: VmPaths = basePaths;
  const sharedDir = sandboxSharedDir(config.stateDir, req.id);
  const kubelet = await askKubelet(config, req);
  // Checked before anything is made: a host-network pod, a missing CNI config or plugin refuse here.
  const net: PodNetworkRecord | null =
    deps.network === undefined ? null : await deps.network.prepare(req.id, podNetworkRequest(req.id, spec));
  // vhost-net where the host has it, QEMU's userspace virtio-net backend otherwise (the dev machines).
  const vhost = existsSync('/dev/vhost-net');
  const planInput: SandboxPlanInput = {
    config: spec,
    handler: req.handler,
    host: deps.host,
    pcieFacts: await deps.readPcieFacts(),
    ...(kubelet === null ? {} : { kubelet }),
    accel: deps.facts.acceleration,
    hypervisor: config.hypervisor,
    vmName: vmNameFor(req.id),
    paths: sandboxArgvPaths(workDir, config.hypervisor),
    simulateVfioWith: config.pcie.simulateVfioWith,
  };
  // The NIC takes the CNI interface's MAC, known after CNI ADD: planned now with a placeholder
  // (same slot, same everything else), planned again with the real MAC before QEMU starts.
  const nicWith = (mac: string): Partial<SandboxPlanInput> => (net === null ? {} : { nic: { tapName: net.tapName, mac, vhost } });
  let plan = planSandbox({ ...planInput, ...nicWith(PLANNED_MAC) });
  log.info({ handler: plan.handler, source: plan.sizing.source, vm: plan.sizing.vm, pcie: plan.pcie.description }, 'sandbox planned');

  const record: SandboxRecord = {
    id: req.id,
    phase: 'creating',
    state: 'SANDBOX_NOTREADY',
    createdAtNs: nowNs(),
    metadata: spec.metadata,
    labels: spec.labels,
    annotations: spec.annotations,
    runtimeHandler: req.runtimeHandler,
    handler: plan.handler,
    cgroupDriver: deps.cgroups.name,
    spec,
    plan,
    shape: plan.sizing.vm,
    topology: plan.pcie.topology,
    vmm: null,
    virtiofsd: null,
    placement: null,
    guest: null,
    guestPod: null,
    network: net,
    exit: null,
  };

  let dirCreated = false;
  let recordWritten = false;
  let sharedMounted = false;
  let virtiofsd: VirtiofsdProcess | undefined;
  let vm: VmProcess | undefined;
  let agent: AgentClient | undefined;
  let placement: PlacementRecord | undefined;
  let networkStarted = false;
  const persist = (): Promise<void> => deps.store.put(record);
  const started = Date.now();
  try {
    await fsp.mkdir(path.dirname(workDir), { recursive: true, mode: 0o700 });
    try {
      await fsp.mkdir(workDir, { mode: 0o700 });
    } catch (err) {
      if (errnoCode(err) === 'EEXIST') throw internal('SANDBOX_WORKDIR_EXISTS', `work directory ${workDir} already exists`);
      throw err;
    }
    dirCreated = true;
    await deps.store.put(record);
    recordWritten = true;
    req.signal.throwIfAborted();

    if (net !== null && deps.network !== undefined) {
      networkStarted = true; // set first: a half-made namespace is removed by the rollback all the same
      await deps.network.setup(net, persist, log);
      plan = planSandbox({ ...planInput, ...nicWith(net.mac!) });
      record.plan = plan;
      await persist();
      req.signal.throwIfAborted();
    }

    if (withAgent) {
      sharedMounted = true; // set first: a half-made mount is released by the rollback all the same
      await prepareSharedDir(sharedDir);
      // virtiofsd listens before QEMU starts: QEMU connects to it as the client.
      virtiofsd = await startVirtiofsd({
        binary: config.hypervisor.virtiofsdBinary,
        socketPath: virtiofsSocket,
        sourceDir: sharedDir,
        logFile: virtiofsdLog,
        logger: log,
      });
      record.virtiofsd = { pid: virtiofsd.pid, startTimeTicks: virtiofsd.startTimeTicks, socketPath: virtiofsSocket };
      await deps.store.put(record);
      req.signal.throwIfAborted();
    }

    vm = await startVm({
      qemuBinary: plan.qemu.binary,
      argv: plan.qemu.argv,
      workDir,
      paths,
      logger: log,
      qmpTimeoutMs: config.hypervisor.qmpTimeoutMs,
      ...(net === null ? {} : { netnsPath: net.netnsPath }),
    });
    record.vmm = {
      pid: vm.pid,
      startTimeTicks: vm.startTimeTicks,
      workDir,
      ...paths,
      ...(withAgent ? { agentSocket, virtiofsSocket } : {}),
    };
    await deps.store.put(record);
    await restrictSocketModes(workDir);
    req.signal.throwIfAborted();

    // Placed while still paused (-S): no guest instruction runs outside the pod's budget, and
    // virtiofsd (which serves the guest's file I/O) shares that budget.
    placement = await deps.cgroups.place({
      sandboxId: req.id,
      cgroupParent,
      pid: vm.pid,
      ...(virtiofsd === undefined ? {} : { extraPids: [virtiofsd.pid] }),
      limits: plan.sizing.host,
    });
    record.placement = placement;
    await deps.store.put(record);
    log.info({ pid: vm.pid, virtiofsdPid: virtiofsd?.pid, placement: deps.cgroups.describe(placement) }, 'VMM placed; resuming the VM');

    await vm.resume();
    const report = await raceAbort(vm.waitForReady(req.readyTimeoutMs), req.signal, requestAbortReason);
    record.guest = { vcpus: report.vcpus, memoryKiB: report.memoryKiB };
    if (withAgent) {
      // The agent starts after init's ready line (node's start-up): the rest of the ready budget.
      const agentTimeoutMs = Math.max(1, req.readyTimeoutMs - (Date.now() - started));
      agent = await raceAbort(
        (deps.connectAgent ?? connectAgentClient)(agentSocket, log, agentTimeoutMs, req.signal),
        req.signal,
        requestAbortReason,
      );
      const pod = await agent.createPod(
        { podId: req.id, hostname: spec.hostname, shmSizeBytes: POD_SHM_SIZE_BYTES },
        { timeoutMs: Math.max(1, req.readyTimeoutMs - (Date.now() - started)), signal: req.signal },
      );
      if (!pod.sharedDirMounted) log.warn({ sharedDir: pod.sharedDir }, 'the guest did not mount the shared directory');
      record.guestPod = { pausePid: pod.pausePid, shmPath: pod.shmPath };
      if (net !== null) {
        await configureGuestNetwork(agent, net, spec, {
          timeoutMs: Math.max(1, req.readyTimeoutMs - (Date.now() - started)),
          signal: req.signal,
        });
      }
    }
    record.phase = 'running';
    record.state = 'SANDBOX_READY';
    await deps.store.put(record);
    log.info({ pid: vm.pid, guest: record.guest, guestPod: record.guestPod, bootMs: Date.now() - started }, 'sandbox ready');
    return { record, vm, agent };
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'sandbox creation failed; rolling back');
    await rollback();
    throw err;
  }

  async function rollback(): Promise<void> {
    const steps: Array<[string, () => Promise<unknown>]> = [];
    // Order matters: the VMM must be gone before its cgroup can be removed, and virtiofsd
    // (which holds the shared directory) before the mounts go.
    if (agent !== undefined) steps.push(['close the agent client', async () => agent!.close()]);
    if (vm !== undefined) steps.push(['kill QEMU', () => vm!.kill()]);
    if (virtiofsd !== undefined) steps.push(['stop virtiofsd', () => virtiofsd!.stop(0)]);
    if (placement !== undefined) steps.push(['remove cgroup', () => deps.cgroups.remove(placement!)]);
    // CNI DEL, TAP and namespace once QEMU (which holds the TAP) is gone.
    if (networkStarted && net !== null) steps.push(['tear down the pod network', () => deps.network!.teardown(net, persist, log)]);
    if (sharedMounted) steps.push(['unmount the shared dir', () => releaseSharedMounts(sharedDir, log)]);
    if (recordWritten) steps.push(['delete record', () => deps.store.delete(req.id)]);
    if (dirCreated) steps.push(['remove work dir', () => removeWorkDir(workDir, log)]);
    for (const [what, step] of steps) {
      try {
        await step();
      } catch (err) {
        log.error({ err: errorMessage(err), step: what }, 'rollback step failed');
      }
    }
  }
}

/**
 * Where a kubelet sends no pod_resources (all released kubelets), the devices assigned to the pod
 * can be asked of the kubelet's PodResources API, as Kata does; off unless a socket is configured.
 */
async function askKubelet(config: KataConfig, req: CreateRequest): Promise<KubeletPodResources | null> {
  const socket = config.pcie.podResourcesSocket;
  if (socket === null || (req.spec.pod_resources?.containers.length ?? 0) > 0) return null;
  const { namespace, name } = req.spec.metadata;
  return getKubeletPodResources(socket, namespace, name, { timeoutMs: 5000 });
}
