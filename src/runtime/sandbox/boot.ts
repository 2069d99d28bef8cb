import type { AgentClient } from '../../agent-client/index.js';
import { raceAbort } from '../../common/abort.js';
import type { VmProcess } from '../../hypervisor/index.js';
import { requestAbortReason } from '../deadline.js';
import { connectAgentClient } from './agent.js';
import type { SandboxRun } from './create-types.js';
import { configureGuestNetwork } from './network.js';

/** The pod's /dev/shm in the guest: what the kubelet and containerd give a pod (the CRI has no size for it). */
export const POD_SHM_SIZE_BYTES = 64 * 1024 * 1024;

/**
 * Resume the placed VM and wait for its guest: the kernel's ready line, then (with a guest image)
 * the agent, the pod in the guest and its network. All of it shares the request's ready budget.
 * Returns the agent's client (undefined without an agent); its close is registered for rollback.
 */
export async function bootGuest(run: SandboxRun, vm: VmProcess): Promise<AgentClient | undefined> {
  const { req, layout, network } = run.prep;
  const { record } = run;
  // The agent starts after init's ready line (node's start-up): each call gets the rest of the budget.
  const remainingMs = () => Math.max(1, req.readyTimeoutMs - (Date.now() - run.startedMs));
  await vm.resume();
  const report = await raceAbort(vm.waitForReady(req.readyTimeoutMs), req.signal, requestAbortReason);
  record.guest = { vcpus: report.vcpus, memoryKiB: report.memoryKiB };
  if (!layout.withAgent) return undefined;

  const connect = run.deps.connectAgent ?? connectAgentClient;
  const agent = await raceAbort(
    connect(layout.agentSocket, run.log, remainingMs(), req.signal, run.deps.config.hypervisor.agentKeepalive),
    req.signal,
    requestAbortReason,
  );
  run.undo.push('close the agent client', async () => agent.close());
  const pod = await agent.createPod(
    { podId: req.id, hostname: req.spec.hostname, shmSizeBytes: POD_SHM_SIZE_BYTES },
    { timeoutMs: remainingMs(), signal: req.signal },
  );
  if (!pod.sharedDirMounted) run.log.warn({ sharedDir: pod.sharedDir }, 'the guest did not mount the shared directory');
  record.guestPod = { pausePid: pod.pausePid, shmPath: pod.shmPath };
  if (network !== null) {
    await configureGuestNetwork(agent, network.record, req.spec, { timeoutMs: remainingMs(), signal: req.signal });
  }
  return agent;
}
