import path from 'node:path';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import type { AccelerationChoice } from '../../hypervisor/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import { planSandbox } from '../../runtime/plan.js';
import { sandboxArgvPaths, sandboxWorkDir, vmNameFor } from '../../runtime/sandbox/paths.js';
import type { RunPodSandboxRequestInput } from '../../sizing/input.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { PlanReport } from './output.js';

/** The id shown in a dry run's paths: no sandbox exists yet. */
export const DRY_RUN_SANDBOX_ID = '0'.repeat(64);

export interface PlanEnvironment {
  config: KataConfig;
  host: HostCapacity;
  pcieFacts: PcieHostFacts;
  accel: AccelerationChoice;
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
  const plan = planSandbox({
    config: sandbox,
    handler,
    host: env.host,
    pcieFacts: env.pcieFacts,
    accel: env.accel,
    hypervisor: env.config.hypervisor,
    vmName: vmNameFor(DRY_RUN_SANDBOX_ID),
    paths: sandboxArgvPaths(workDir, env.config.hypervisor),
    simulateVfioWith: env.config.pcie.simulateVfioWith,
  });
  const metadata = sandbox.metadata;
  return {
    handler: handler.name,
    pod: { name: metadata?.name ?? '', namespace: metadata?.namespace ?? '', uid: metadata?.uid ?? '' },
    hostCapacity: env.host,
    sizing: plan.sizing,
    pcie: plan.pcie,
    qemu: { binary: plan.qemu.binary, accel: plan.qemu.accel, argv: plan.qemu.argv, workDir: path.normalize(workDir) },
  };
}
