import { isKataError } from '../../common/errors.js';
import type { KubernetesResourcesInput, QuantityInput } from '../../sizing/input.js';
import { parseQuantity, type Quantity, quantityEquals } from '../../sizing/quantity.js';
import { ABSENT, type Difference } from './types.js';

type QuantityMap = Record<string, QuantityInput | null | undefined> | null | undefined;

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** `kubernetes_resources.limits.memory`, or `kubernetes_resources.limits["hugepages-2Mi"]` for names that are not identifiers. */
export function resourcePath(which: 'requests' | 'limits', name: string): string {
  const base = `kubernetes_resources.${which}`;
  return IDENTIFIER.test(name) ? `${base}.${name}` : `${base}[${JSON.stringify(name)}]`;
}

type Parsed = { ok: true; quantity: Quantity; text: string } | { ok: false; display: string };

function parseEntry(value: QuantityInput | null | undefined, field: string): Parsed {
  const text = value?.string;
  if (typeof text !== 'string') return { ok: false, display: 'no value (invalid quantity: QUANTITY_MISSING)' };
  try {
    return { ok: true, quantity: parseQuantity(text, field), text };
  } catch (err) {
    // Admission reports, it does not throw: the container is refused with every difference named.
    const reason = isKataError(err) ? err.reason : 'QUANTITY_MALFORMED';
    return { ok: false, display: `${JSON.stringify(text)} (invalid quantity: ${reason})` };
  }
}

function compareList(which: 'requests' | 'limits', announced: QuantityMap, received: QuantityMap): Difference[] {
  const a = announced ?? {};
  const r = received ?? {};
  const names = [...new Set([...Object.keys(a), ...Object.keys(r)])].sort();
  const out: Difference[] = [];
  for (const name of names) {
    const field = resourcePath(which, name);
    const hasA = Object.hasOwn(a, name);
    const hasR = Object.hasOwn(r, name);
    const pa = hasA ? parseEntry(a[name], field) : undefined;
    const pr = hasR ? parseEntry(r[name], field) : undefined;
    const show = (p: Parsed | undefined): string => (p === undefined ? ABSENT : p.ok ? p.text : p.display);
    // By value: 1000m == 1, 1Gi == 1073741824, 0.5 == 500m. A value that does not parse never
    // equals anything (nothing can be admitted with it), and one side only is a difference.
    const equal = pa !== undefined && pr !== undefined && pa.ok && pr.ok && quantityEquals(pa.quantity, pr.quantity);
    if (!equal) out.push({ field, announced: show(pa), received: show(pr) });
  }
  return out;
}

/**
 * Compare a container's `kubernetes_resources` with the announced ones, resource by resource, by
 * value. Compared literally otherwise: no defaulting of a missing request to its limit (the
 * kubelet builds both messages from the same defaulted pod spec, so a legitimate request never
 * differs that way). Absent (null) and empty are the same: no requests, no limits.
 */
export function compareKubernetesResources(
  announced: KubernetesResourcesInput | null | undefined,
  received: KubernetesResourcesInput | null | undefined,
): Difference[] {
  return [
    ...compareList('requests', announced?.requests, received?.requests),
    ...compareList('limits', announced?.limits, received?.limits),
  ];
}
