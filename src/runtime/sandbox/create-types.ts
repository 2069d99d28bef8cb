/**
 * The types RunPodSandbox's halves share (prepare.ts plans, execute.ts and boot.ts carry the plan
 * out, create.ts joins them): kept apart so that those files import each other in one direction.
 */
import type { AgentClient } from '../../agent-client/index.js';
import type { CgroupDriver } from '../../cgroups/index.js';
import type { Logger } from '../../common/logger.js';
import type { ResolvedHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { JailSpec, startVirtiofsd, startVm, VmmIdentity, VmPaths, VmProcess } from '../../hypervisor/index.js';
import type { PodNetworkRecord, PodNetworks } from '../../network/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { RuntimeFacts } from '../facts.js';
import type { SandboxPlanInput } from '../plan.js';
import type { RollbackSteps } from '../rollback.js';
import type { SandboxSpec } from '../spec/sandbox.js';
import type { RecordStore } from '../store.js';
import type { connectAgentClient } from './agent.js';
import type { VmmIdentities } from './identities.js';
import type { buildJail, releaseJail } from './jail.js';
import type { SandboxRecord } from './record.js';
import type { prepareSharedDir, releaseSharedMounts } from './shared-dir.js';

export interface CreateDeps {
  /** The node's VMM identity leases (tests give their own); one over config.hypervisor.vmmIdentities unless given. */
  identities?: VmmIdentities;
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
  /** Pre-booted VMs (src/runtime/pool, docs/pool.md); absent: every pod boots cold. */
  pool?: SandboxPool;
  /** VM templates (src/runtime/template, docs/templates.md); absent: no pod is a clone. */
  templates?: SandboxTemplates;
}

/**
 * What RunPodSandbox asks first: a clone of the handler's template grown into `prep`'s plan, or
 * why not (`miss` null: the handler does not clone at all). A failed clone has left nothing.
 */
export interface SandboxTemplates {
  clone(deps: CreateDeps, prep: SandboxPreparation): Promise<TemplateAnswer>;
}

/** A clone made the pod's, or why there is none (null: templates are off for the handler). */
export type TemplateAnswer =
  | { kind: 'clone'; created: CreatedSandbox }
  | { kind: 'miss'; miss: { reason: string; message: string } | null };

/**
 * What RunPodSandbox asks of the pool after planning: a pooled VM grown into `prep`'s plan, or
 * null when none fits or the claim failed (then `prep.record.origin` says why, and the pod boots
 * cold; a failed claim has discarded its VM and left nothing behind).
 */
export interface SandboxPool {
  claim(deps: CreateDeps, prep: SandboxPreparation): Promise<CreatedSandbox | null>;
}

/**
 * What starting a pod's swtpm takes (src/tpm/swtpm.ts's StartSwtpmOptions, per the issue-31
 * contract): its state dir, control socket and log; the node's EK CA; its own identity, and the
 * identity (QEMU's) that may connect to the socket.
 */
export interface StartSwtpmRequest {
  stateDir: string;
  ctrlSocketPath: string;
  logFile: string;
  caDir: string;
  binary?: string;
  setupBinary?: string;
  identity?: VmmIdentity;
  /** The jail built for swtpm's identity (required with `identity`). */
  jail?: { jailDir: string };
  clientIdentity?: VmmIdentity;
  logger: Logger;
}

/** A running swtpm as src/tpm/swtpm.ts hands it back (its SwtpmProcess). */
export interface SwtpmHandle {
  pid: number;
  startTimeTicks: number;
  ctrlSocketPath: string;
  /** The EK certificate swtpm_setup made, signed by the node's CA. */
  ekCertPem: string;
  /** Every pid of it, to place in the pod's cgroup. */
  pids(): number[];
  stop(timeoutMs?: number): Promise<void>;
}

/** The effects of RunPodSandbox that start a process or mount something, as one replaceable set. */
export interface SandboxLaunchers {
  startSwtpm(request: StartSwtpmRequest): Promise<SwtpmHandle>;
  /** swtpm's jail: the spec src/tpm/swtpm.ts asks for (its state dir, its socket's dir, /usr). */
  swtpmJailSpec(o: { jailDir: string; stateDir: string; ctrlSocketPath: string; binary?: string }): Promise<Omit<JailSpec, 'rootLinks'>>;
  startVm: typeof startVm;
  startVirtiofsd: typeof startVirtiofsd;
  prepareSharedDir: typeof prepareSharedDir;
  releaseSharedMounts: typeof releaseSharedMounts;
  buildJail: typeof buildJail;
  releaseJail: typeof releaseJail;
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
  /** A network namespace the caller made and attached, to join (SandboxRunOptions.joinNetns). */
  joinNetns?: string;
}

/** A sandbox whose guest answered ready, as RunPodSandbox hands it to the manager. */
export interface CreatedSandbox {
  record: SandboxRecord;
  vm: VmProcess;
  agent: AgentClient | undefined;
}

/** Where a sandbox's files and sockets go on the host (all under its work dir). */
export interface SandboxLayout {
  workDir: string;
  /** The handler confines QEMU: an identity of its own, the VMM dir and the jail below. */
  confined: boolean;
  /** A confined QEMU's own files (sandboxVmmDir); unused unconfined. */
  vmmDir: string;
  /** A confined QEMU's chroot (sandboxJailDir); unused unconfined. */
  jailDir: string;
  /** What virtiofsd shares with the guest. */
  sharedDir: string;
  /** QEMU's own: QMP, ready, console and log. */
  vmPaths: VmPaths;
  agentSocket: string;
  virtiofsSocket: string;
  virtiofsdLog: string;
  /**
   * The guest image carries the agent: without one the VM runs no containers, so it gets neither
   * the agent's port nor virtio-fs (a VM shaped as before the agent existed).
   */
  withAgent: boolean;
}

/** Everything RunPodSandbox decided before changing anything; executeSandbox carries it out. */
export interface SandboxPreparation {
  req: CreateRequest;
  cgroupParent: string;
  layout: SandboxLayout;
  /**
   * The pod network to make, or the caller's namespace to join (validated; nothing made yet), or
   * null without pod networking.
   */
  network: { networks: PodNetworks; record: PodNetworkRecord } | null;
  /** What the plan was made from: planned again with the CNI interface's MAC once it is known. */
  planInput: SandboxPlanInput;
  /** The record as it is first written (phase `creating`), holding the plan. */
  record: SandboxRecord;
}

/** One executeSandbox call: what every step reads, the record they fill in, the undo list they add to. */
export interface SandboxRun {
  deps: CreateDeps;
  prep: SandboxPreparation;
  record: SandboxRecord;
  log: Logger;
  undo: RollbackSteps;
  launchers: SandboxLaunchers;
  /** Write the record as it is now. */
  persist(): Promise<void>;
  /** When execution began (Date.now()): the guest's ready budget counts from here. */
  startedMs: number;
}
