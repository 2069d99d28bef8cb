import type { AgentClient } from '../../agent-client/index.js';
import type { CgroupDriver } from '../../cgroups/index.js';
import type { Logger } from '../../common/logger.js';
import type { ResolvedHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { startVirtiofsd, startVm, VmProcess } from '../../hypervisor/index.js';
import type { PodNetworks } from '../../network/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { RuntimeFacts } from '../facts.js';
import type { SandboxSpec } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import type { connectAgentClient } from './agent.js';
import { executeSandbox } from './execute.js';
import { prepareSandbox } from './prepare.js';
import type { SandboxRecord } from './record.js';
import type { prepareSharedDir, releaseSharedMounts } from './shared-dir.js';

export interface CreateDeps {
  /** How to reach a guest's agent (tests replace it); connectAgentClient unless given. */
  connectAgent?: typeof connectAgentClient;
  /** What starts the sandbox's host processes and mounts its shared dir (tests replace it); the real ones unless given. */
  launchers?: SandboxLaunchers;
  config: KataConfig;
  facts: RuntimeFacts;
  store: RecordStore<SandboxRecord>;
  cgroups: CgroupDriver;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
  /** Pod networking (network.mode "cni"); absent: pod VMs get no NIC. */
  network?: PodNetworks;
}

/** The effects of RunPodSandbox that start a process or mount something, as one replaceable set. */
export interface SandboxLaunchers {
  startVm: typeof startVm;
  startVirtiofsd: typeof startVirtiofsd;
  prepareSharedDir: typeof prepareSharedDir;
  releaseSharedMounts: typeof releaseSharedMounts;
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

/** A sandbox whose guest answered ready, as RunPodSandbox hands it to the manager. */
export interface CreatedSandbox {
  record: SandboxRecord;
  vm: VmProcess;
  agent: AgentClient | undefined;
}

/**
 * RunPodSandbox: validate, gather facts and plan with no side effect (prepareSandbox), then carry
 * the plan out (executeSandbox), where every effect registers its undo as it is made and a failure
 * rolls them all back before the error is rethrown.
 */
export async function createSandbox(deps: CreateDeps, req: CreateRequest): Promise<CreatedSandbox> {
  return executeSandbox(deps, await prepareSandbox(deps, req));
}
