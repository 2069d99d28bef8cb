import path from 'node:path';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import { type AccelerationChoice, type GuestImageVerity, ROOT_SLOTS } from '../../hypervisor/index.js';
import { initdataFromAnnotations, initdataLaunch, snpHostData, tdxMrConfigId } from '../../measure/initdata.js';
import { netnsNameFor, POD_TAP_NAME } from '../../network/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { TeeFacts } from '../../runtime/facts.js';
import { planSandbox } from '../../runtime/plan.js';
import { PLANNED_MAC } from '../../runtime/sandbox/network.js';
import {
  sandboxArgvPaths,
  sandboxJailDir,
  sandboxTeePaths,
  sandboxVmmDir,
  sandboxWorkDir,
  vmNameFor,
} from '../../runtime/sandbox/paths.js';
import type { RunPodSandboxRequestInput } from '../../sizing/input.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { PlanReport } from './output.js';

/** The id shown in a dry run's paths: no sandbox exists yet. */
export const DRY_RUN_SANDBOX_ID = '0'.repeat(64);

export interface PlanEnvironment {
  config: KataConfig;
  /** Whether /dev/vhost-net exists (the NIC's backend); false unless told. */
  vhostNet?: boolean;
  host: HostCapacity;
  pcieFacts: PcieHostFacts;
  accel: AccelerationChoice;
  /** The host's TEEs and QEMU's version (gatherFacts); absent: no hardware TEE, version unknown. */
  tee?: TeeFacts;
  /** The guest image's dm-verity table (readGuestImageVerity); absent or null: it has none. */
  guestImageVerity?: GuestImageVerity | null;
}

/**
 * Plan a decoded request (pure): resolve the handler (`handlerOverride`, else the request's
 * runtime_handler, else the config's default) and plan it exactly as RunPodSandbox would, with the
 * paths a sandbox would get under the configured state dir.
 */
export function buildPlanReport(request: RunPodSandboxRequestInput, env: PlanEnvironment, handlerOverride?: string): PlanReport {
  const handler = resolveHandler(env.config, handlerOverride ?? request.runtime_handler ?? '');
  const sandbox = request.config ?? {};
  const workDir = sandboxWorkDir(env.config.stateDir, DRY_RUN_SANDBOX_ID);
  const confined = handler.profile.vmmConfinement.unprivileged;
  const cni = env.config.network.mode === 'cni';
  const vhost = env.vhostNet ?? false;
  const plan = planSandbox({
    ...(cni ? { nic: { tapName: POD_TAP_NAME, mac: PLANNED_MAC, vhost } } : {}),
    config: sandbox,
    handler,
    host: env.host,
    pcieFacts: env.pcieFacts,
    accel: env.accel,
    hypervisor: env.config.hypervisor,
    vmName: vmNameFor(DRY_RUN_SANDBOX_ID),
    paths: sandboxArgvPaths(workDir, env.config.hypervisor, confined),
    ...(env.tee === undefined ? {} : { tee: env.tee }),
    ...(env.guestImageVerity === undefined ? {} : { guestImageVerity: env.guestImageVerity }),
    teePaths: sandboxTeePaths(workDir, confined),
    ...initdataOf(sandbox.annotations),
    simulateVfioWith: env.config.pcie.simulateVfioWith,
  });
  // Initdata only where a launch measurement binds it: refused without a TEE, as RunPodSandbox does.
  const initdata = initdataFromAnnotations(sandbox.annotations);
  if (initdata !== null) initdataLaunch(initdata, plan.tee?.kind ?? 'none', plan.handler);
  const metadata = sandbox.metadata;
  return {
    handler: handler.name,
    pod: { name: metadata?.name ?? '', namespace: metadata?.namespace ?? '', uid: metadata?.uid ?? '' },
    hostCapacity: env.host,
    sizing: plan.sizing,
    pcie: plan.pcie,
    qemu: { binary: plan.qemu.binary, accel: plan.qemu.accel, argv: plan.qemu.argv, workDir: path.normalize(workDir) },
    ...(plan.tee === undefined ? {} : { tee: plan.tee }),
    vmm: {
      ...plan.vmm,
      leaseDir: confined ? env.config.hypervisor.vmmIdentities.leaseDir : null,
      jailDir: confined ? sandboxJailDir(workDir) : null,
      vmmDir: confined ? sandboxVmmDir(workDir) : null,
    },
    network: cni
      ? {
          cniConfDir: env.config.network.cniConfDir,
          netns: netnsNameFor(DRY_RUN_SANDBOX_ID),
          tapName: POD_TAP_NAME,
          slot: `bus=pcie.0,addr=${ROOT_SLOTS.nic.toString(16).padStart(2, '0')}.0`,
          vhost,
          plannedMac: PLANNED_MAC,
        }
      : null,
  };
}

/** The pod's initdata bindings (a malformed annotation is refused, naming it), as RunPodSandbox plans them. */
function initdataOf(annotations: Record<string, string> | undefined): { initdata?: { snpHostData: Buffer; tdxMrConfigId: Buffer } } {
  const initdata = initdataFromAnnotations(annotations);
  return initdata === null ? {} : { initdata: { snpHostData: snpHostData(initdata), tdxMrConfigId: tdxMrConfigId(initdata) } };
}
