/**
 * A pod's VM as a clone of its handler's template (docs/templates.md, "Pods from a template"):
 * the work dir and the record (phase `creating`) first, as a cold boot makes them; the pod
 * network (namespace, CNI ADD, TAP) before the clone, whose QEMU runs in that namespace; the
 * shared directory, which the clone's QEMU serves over 9p (virtio-fs cannot serve a clone); the
 * clone restored with its QEMU placed in the pod's cgroup while still stopped, its agent dialled
 * and the guest reseeded; then the pool claim's steps: NIC and 9p device hot-plugged on the
 * template's two ports, vCPUs and virtio-mem grown to the plan, CreatePod and the network in the
 * guest. Every step registers its undo; a failure runs them all and answers why, so that the pod
 * falls back to the pool or a cold boot with nothing of the clone left.
 */
import { errorMessage, isKataError } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { plugNic } from '../../hypervisor/index.js';
import { planClone9pDevice, type TemplateVmSpec } from '../../hypervisor/template.js';
import { netnsPathOf } from '../../network/index.js';
import { type ClaimBudget, growAndStartPod, restorePrepared } from '../pool/claim.js';
import { POOL_NIC_PORT_ID, POOL_VFS_PORT_ID, planClaim } from '../pool/plan.js';
import { RollbackSteps } from '../rollback.js';
import type { CreateDeps, CreatedSandbox, SandboxPreparation, SandboxRun } from '../sandbox/create-types.js';
import { attachNetwork, makeWorkDir, placeVmm } from '../sandbox/execute.js';
import { prepareSharedDir, releaseSharedMounts } from '../sandbox/shared-dir.js';
import type { TemplateMiss } from './plan.js';
import type { TemplateStore } from './store.js';

export interface CloneClaimInput {
  deps: CreateDeps;
  prep: SandboxPreparation;
  store: TemplateStore;
  spec: TemplateVmSpec;
}

/** The pod's VM, or why there is none (everything made for the clone undone). */
export type CloneClaimOutcome = { kind: 'clone'; created: CreatedSandbox } | { kind: 'miss'; miss: TemplateMiss };

export async function claimClone(input: CloneClaimInput, log: Logger): Promise<CloneClaimOutcome> {
  const { deps, prep, store, spec } = input;
  const { req, layout, record } = prep;
  const prepared = structuredClone(record);
  const preparedNetwork = record.network;
  const run: SandboxRun = {
    deps,
    prep,
    record,
    log,
    undo: new RollbackSteps(log),
    // Only the shared dir's helpers are used here: a clone has no virtiofsd, jail or swtpm.
    launchers: deps.launchers ?? ({ prepareSharedDir, releaseSharedMounts } as SandboxRun['launchers']),
    persist: () => deps.store.put(record),
    startedMs: Date.now(),
  };
  const budgetMs = cloneBudgetMs(req.readyTimeoutMs, deps.config.pool.claimTimeoutMs);
  try {
    await makeWorkDir(run);
    const { vmm } = record.plan;
    record.confinement = { seccomp: vmm.seccomp, optOutReason: vmm.optOutReason, identity: null, jailDir: null, vmmDir: null };
    await deps.store.put(record);
    run.undo.push('delete record', () => deps.store.delete(req.id));
    req.signal.throwIfAborted();
    if (prep.network !== null) await attachNetwork(run, prep.network.networks, prep.network.record, undefined);
    const attachedMs = Date.now() - run.startedMs;
    run.undo.push('unmount the shared dir', () => run.launchers.releaseSharedMounts(layout.sharedDir, log));
    await run.launchers.prepareSharedDir(layout.sharedDir);
    const started: { vm?: CreatedSandbox['vm'] } = {};
    const outcome = await store.tryClone(
      spec,
      {
        workDir: layout.workDir,
        name: prep.planInput.vmName,
        agentTimeoutMs: budgetMs,
        signal: req.signal,
        // QEMU serves the pod's shared dir as root (an unconfined handler: config validation).
        share: { hostDir: layout.sharedDir, securityModel: 'none' },
        ...(prep.network === null ? {} : { netnsPath: netnsPathOf(prep.network.record) }),
        place: (pid) => placeVmm(run, pid, [undefined, undefined], started),
        qmpTimeoutMs: deps.config.hypervisor.qmpTimeoutMs,
      },
      { build: false },
    );
    if (outcome.kind === 'miss') {
      await run.undo.run();
      restorePrepared(record, prepared, preparedNetwork);
      req.signal.throwIfAborted();
      return { kind: 'miss', miss: { reason: outcome.reason, message: outcome.message } };
    }
    const clonedMs = Date.now() - run.startedMs;
    const { clone, template } = outcome;
    const { vm, agent } = clone;
    started.vm = vm;
    run.undo.push('close the agent client', async () => agent.close());
    run.undo.push('kill QEMU', () => vm.kill());
    record.vmm = {
      pid: vm.pid,
      startTimeTicks: vm.startTimeTicks,
      workDir: layout.workDir,
      ...layout.vmPaths,
      agentSocket: clone.agentSocket,
    };
    const t = spec.shape;
    record.origin = {
      kind: 'template',
      templateName: template.templateDir.slice(template.templateDir.lastIndexOf('/') + 1),
      templateShape: { vcpus: t.vcpus, memoryMiB: t.memoryMiB, maxVcpus: t.maxVcpus, maxMemoryMiB: t.maxMemoryMiB },
      cloneReadyMs: clone.readyMs,
    };
    await run.persist();
    // The pool claim's steps on the clone, within the claim's own budget.
    const budget = claimBudget(req.signal, budgetMs);
    const claim = planClaim(record.plan, { ...spec.shape, hugepages: [], kernelParams: [] }, record.network !== null);
    const net = record.network;
    if (net !== null) {
      if (net.mac === null) throw new Error('the pod network was set up without a MAC');
      await plugNic(vm.qmp, { tapName: net.tapName, mac: net.mac, vhost: false, bus: claim.nic?.portId ?? POOL_NIC_PORT_ID });
    }
    await vm.qmp.execute('device_add', planClone9pDevice(POOL_VFS_PORT_ID));
    budget.checkBudget();
    const steps = await growAndStartPod({ vm, agent, claim, record, prep, budget, guestBefore: template.record.guest }, log);
    record.phase = 'running';
    record.state = 'SANDBOX_READY';
    await run.persist();
    log.info(
      { pid: vm.pid, guest: record.guest, readyMs: Date.now() - run.startedMs, attachedMs, clonedMs, cloneReadyMs: clone.readyMs, steps },
      'sandbox ready from a template',
    );
    return { kind: 'clone', created: { record, vm, agent } };
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'starting the pod from a template failed; rolling the clone back');
    await run.undo.run();
    restorePrepared(record, prepared, preparedNetwork);
    // The caller gave up (its deadline, a cancel): its own error, not a fallback to a cold boot.
    req.signal.throwIfAborted();
    return {
      kind: 'miss',
      miss: {
        reason: isKataError(err) ? err.reason : 'TEMPLATE_CLAIM_FAILED',
        message: `the clone could not be made the pod's: ${errorMessage(err)}`,
      },
    };
  }
}

/**
 * A clone's budget for each of its waits (the agent, the reseed, then growth and the pod): half of
 * the pod's ready budget, at least pool.claimTimeoutMs (never more than the whole). More than a
 * pooled VM gets: under contention a clone is slower, yet far quicker than the cold boot it would
 * fall back to. Measured in the density bench (8 pods at once, 2 cores, TCG): with the claim's 30 s,
 * 7 of 8 clones gave up on their agents and booted cold (medians 182 s); the one that waited was
 * ready in 50 s. Pure.
 */
export function cloneBudgetMs(readyTimeoutMs: number, claimTimeoutMs: number): number {
  return Math.min(readyTimeoutMs, Math.max(claimTimeoutMs, Math.floor(readyTimeoutMs / 2)));
}

function claimBudget(requestSignal: AbortSignal, budgetMs: number): ClaimBudget {
  const started = Date.now();
  const deadline = AbortSignal.timeout(budgetMs);
  const signal = AbortSignal.any([requestSignal, deadline]);
  return {
    remainingMs: () => Math.max(1, budgetMs - (Date.now() - started)),
    signal,
    checkBudget: () => {
      requestSignal.throwIfAborted();
      if (deadline.aborted) throw new Error(`the clone's claim ran past its budget of ${budgetMs} ms`);
    },
  };
}
