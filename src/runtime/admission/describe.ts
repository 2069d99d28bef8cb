import { type KataError, precondition } from '../../common/errors.js';
import type { Difference } from './types.js';

/** Differences named in full before the rest is summarised as "and N more". */
export const MAX_DESCRIBED_DIFFERENCES = 20;
/** A longer display value is cut (with an ellipsis) so that one huge value cannot flood a status. */
export const MAX_VALUE_CHARS = 120;

function clip(value: string): string {
  return value.length <= MAX_VALUE_CHARS ? value : `${value.slice(0, MAX_VALUE_CHARS - 1)}…`;
}

/**
 * One sentence for a FAILED_PRECONDITION status naming every differing field with its announced
 * and received value, e.g. `container "app" differs from what RunPodSandbox announced:
 * kubernetes_resources.limits.memory announced 1Gi, received 2Gi; mounts["/data"].readonly
 * announced true, received false`. Bounded: at most MAX_DESCRIBED_DIFFERENCES fields, then
 * `and N more`; values longer than MAX_VALUE_CHARS are cut.
 */
export function describeDifferences(containerName: string, diffs: readonly Difference[]): string {
  const head = `container ${clip(JSON.stringify(containerName))} differs from what RunPodSandbox announced`;
  if (diffs.length === 0) return `${head}: no differences`;
  const shown = diffs
    .slice(0, MAX_DESCRIBED_DIFFERENCES)
    .map((d) => `${d.field} announced ${clip(d.announced)}, received ${clip(d.received)}`);
  const rest = diffs.length - MAX_DESCRIBED_DIFFERENCES;
  if (rest > 0) shown.push(`and ${rest} more`);
  return `${head}: ${shown.join('; ')}`;
}

/**
 * The error CreateContainer answers with when admission finds differences: kind precondition
 * (FAILED_PRECONDITION: the request is well formed, but not what this sandbox's VM was shaped
 * for), reason ADMISSION_MISMATCH, details `{ container, differences }` with all of them.
 */
export function admissionError(containerName: string, diffs: readonly Difference[]): KataError {
  return precondition('ADMISSION_MISMATCH', describeDifferences(containerName, diffs), {
    details: { container: containerName, differences: diffs.map((d) => ({ ...d })) },
  });
}
