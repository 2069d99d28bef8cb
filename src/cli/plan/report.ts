import type { KataConfig } from '../../config/types.js';
import { resolveHandler } from '../../config/handlers.js';
import type { RunPodSandboxRequestInput } from '../../sizing/input.js';
import { planSizing } from '../../sizing/shape.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { PlanReport } from './output.js';

/**
 * Plan a decoded request (pure): resolve the handler (`handlerOverride`, else the request's
 * runtime_handler, else the config's default) and size the pod for `host`.
 */
export function buildPlanReport(
  request: RunPodSandboxRequestInput,
  config: KataConfig,
  host: HostCapacity,
  handlerOverride?: string,
): PlanReport {
  const handler = resolveHandler(config, handlerOverride ?? request.runtime_handler ?? '');
  const sandbox = request.config ?? {};
  const sizing = planSizing({ config: sandbox, handler, host });
  const metadata = sandbox.metadata;
  return {
    handler: handler.name,
    pod: { name: metadata?.name ?? '', namespace: metadata?.namespace ?? '', uid: metadata?.uid ?? '' },
    hostCapacity: host,
    sizing,
  };
}
