import type { SizingContainerType } from './types.js';

/**
 * Kubernetes' pod-level aggregation of container resources (k8s.io/component-helpers/resource,
 * PodRequests/PodLimits, with sidecar containers from KEP-753), over any per-container amounts:
 *
 * - regular containers and sidecars (restartable init containers) run together in the steady
 *   state, so they add up;
 * - init containers run one at a time, in order; while the i-th one-shot init container runs,
 *   the sidecars declared before it are already running beside it:
 *     InitUse(i) = Σ sidecars before i + init(i)      (one-shot init container)
 *     InitUse(i) = Σ sidecars up to and including i   (sidecar)
 * - the pod needs, per resource, max(steady state, max_i InitUse(i)).
 *
 * A resource a container does not mention contributes nothing, exactly as in Kubernetes; the
 * sizing planner decides beforehand what an unlimited container counts with.
 */
export interface AggregationEntry {
  type: SizingContainerType;
  /** Resource key -> amount (nanos, or any unit: the rules only add and compare). */
  amounts: ReadonlyMap<string, bigint>;
}

function addInto(target: Map<string, bigint>, amounts: ReadonlyMap<string, bigint>): void {
  for (const [key, value] of amounts) target.set(key, (target.get(key) ?? 0n) + value);
}

function maxInto(target: Map<string, bigint>, amounts: ReadonlyMap<string, bigint>): void {
  for (const [key, value] of amounts) {
    const current = target.get(key);
    if (current === undefined || value > current) target.set(key, value);
  }
}

/** Aggregate containers given in pod order (init containers in their order; regular ones anywhere). */
export function aggregatePodAmounts(entries: readonly AggregationEntry[]): Map<string, bigint> {
  const steady = new Map<string, bigint>();
  const sidecarsSoFar = new Map<string, bigint>();
  const initPeak = new Map<string, bigint>();
  for (const entry of entries) {
    if (entry.type === 'REGULAR_CONTAINER') {
      addInto(steady, entry.amounts);
    } else if (entry.type === 'SIDECAR_CONTAINER') {
      addInto(steady, entry.amounts);
      addInto(sidecarsSoFar, entry.amounts);
      maxInto(initPeak, sidecarsSoFar);
    } else {
      const running = new Map(sidecarsSoFar);
      addInto(running, entry.amounts);
      maxInto(initPeak, running);
    }
  }
  maxInto(steady, initPeak);
  return steady;
}
