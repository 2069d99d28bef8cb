import { invalid } from '../common/errors.js';
import type { KubernetesResourcesInput, QuantityInput } from './input.js';
import { parseQuantity, type Quantity } from './quantity.js';

/**
 * Kubernetes resource names and requirement lists (`requests` / `limits` maps of quantities), as
 * the sizing planner understands them.
 */

export type ResourceKind = 'cpu' | 'memory' | 'hugepages' | 'extended' | 'ignored';

/** Guest hugepage sizes x86-64 offers, keyed by bytes: the Kubernetes spelling and the kernel's. */
export const HUGEPAGE_SIZES: ReadonlyMap<bigint, { name: string; kernel: string }> = new Map([
  [2n * 1024n * 1024n, { name: '2Mi', kernel: '2M' }],
  [1024n * 1024n * 1024n, { name: '1Gi', kernel: '1G' }],
]);

export const HUGEPAGES_PREFIX = 'hugepages-';

export interface ResourceClass {
  /** Canonical key: `cpu`, `memory`, `hugepages-2Mi` (also for `hugepages-2048Ki`), or the name. */
  key: string;
  kind: ResourceKind;
  /** For hugepages: the page size in bytes. */
  pageSizeBytes?: bigint;
}

/**
 * Classify a resource name the way Kubernetes validation does for container resources: cpu,
 * memory, ephemeral-storage (not a VM-sizing concern, ignored), hugepages-<page size>, or an
 * extended resource (a domain-qualified name outside kubernetes.io, such as nvidia.com/gpu).
 */
export function classifyResourceName(name: string, field: string): ResourceClass {
  if (name === 'cpu' || name === 'memory') return { key: name, kind: name };
  if (name === 'ephemeral-storage') return { key: name, kind: 'ignored' };
  if (name.startsWith(HUGEPAGES_PREFIX)) {
    const sizeText = name.slice(HUGEPAGES_PREFIX.length);
    let pageSize: Quantity;
    try {
      pageSize = parseQuantity(sizeText, `${field} page size`);
    } catch (cause) {
      throw invalid('SIZING_HUGEPAGE_SIZE_INVALID', `${field} names "${name}", whose page size is not a quantity`, { cause });
    }
    const bytes = pageSize.nanos / 1_000_000_000n;
    const size = pageSize.nanos % 1_000_000_000n === 0n ? HUGEPAGE_SIZES.get(bytes) : undefined;
    if (size === undefined) {
      throw invalid(
        'SIZING_HUGEPAGE_SIZE_UNSUPPORTED',
        `${field} asks for "${name}", but the guest offers only hugepages-2Mi and hugepages-1Gi`,
        { details: { field, name } },
      );
    }
    return { key: HUGEPAGES_PREFIX + size.name, kind: 'hugepages', pageSizeBytes: bytes };
  }
  const slash = name.indexOf('/');
  if (slash > 0 && slash < name.length - 1 && !name.startsWith('requests.')) {
    const domain = name.slice(0, slash);
    if (domain !== 'kubernetes.io' && !domain.endsWith('.kubernetes.io')) return { key: name, kind: 'extended' };
  }
  throw invalid(
    'SIZING_RESOURCE_UNKNOWN',
    `${field} names the resource "${name}", which is not cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified extended resource`,
    { details: { field, name } },
  );
}

/** An entry of a requirements map: the parsed amount and the resource's class. */
export interface ResourceAmount {
  quantity: Quantity;
  cls: ResourceClass;
}

/** Parsed `requests` and `limits`, keyed by canonical resource key. */
export interface ParsedRequirements {
  requests: Map<string, ResourceAmount>;
  limits: Map<string, ResourceAmount>;
}

/** Where the names and values of a requirements list live, for messages. */
export interface RequirementPaths {
  /** Path of the list itself, e.g. `spec.containers[0].resources.limits`. */
  list: (which: 'requests' | 'limits') => string;
  /** Path of one entry, e.g. `spec.containers[0].resources.limits.cpu`. */
  entry: (which: 'requests' | 'limits', name: string) => string;
}

/** Paths in a decoded CRI message: `<at>.requests["cpu"]`. */
export function protoPaths(at: string): RequirementPaths {
  return {
    list: (which) => `${at}.${which}`,
    entry: (which, name) => `${at}.${which}[${JSON.stringify(name)}]`,
  };
}

function quantityText(value: QuantityInput | string | number | null | undefined, field: string): string {
  if (typeof value === 'string') return value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  if (typeof value === 'object' && value !== null && typeof value.string === 'string') return value.string;
  throw invalid('QUANTITY_MISSING', `${field} has no quantity`, { details: { field } });
}

function parseList(
  list: Record<string, QuantityInput | string | number | null | undefined> | null | undefined,
  which: 'requests' | 'limits',
  paths: RequirementPaths,
): Map<string, ResourceAmount> {
  const out = new Map<string, ResourceAmount>();
  if (list === null || list === undefined) return out;
  for (const [name, value] of Object.entries(list)) {
    const field = paths.entry(which, name);
    const cls = classifyResourceName(name, paths.list(which));
    const quantity = parseQuantity(quantityText(value, field), field);
    const previous = out.get(cls.key);
    // `hugepages-2Mi` and `hugepages-2048Ki` are the same pool: add them up.
    out.set(
      cls.key,
      previous === undefined
        ? { quantity, cls }
        : { quantity: { nanos: previous.quantity.nanos + quantity.nanos, text: `${previous.quantity.text}+${quantity.text}` }, cls },
    );
  }
  return out;
}

/** Kubernetes lets only cpu and memory be overcommitted (request < limit); hugepages and extended resources may not. */
export function isOvercommitAllowed(cls: ResourceClass): boolean {
  return cls.kind === 'cpu' || cls.kind === 'memory' || cls.kind === 'ignored';
}

/**
 * Parse and check one requirements list. Refuses (INVALID) what Kubernetes validation refuses and
 * the planner cannot size: a limit below its request (SIZING_LIMIT_BELOW_REQUEST), a request that
 * differs from the limit of a resource that cannot be overcommitted
 * (SIZING_REQUEST_NOT_EQUAL_LIMIT), a fractional extended resource (SIZING_EXTENDED_NOT_INTEGER).
 * Does not default anything: callers decide (containers and pods default differently).
 */
export function parseRequirements(
  resources:
    | {
        requests?: Record<string, QuantityInput | string | number | null | undefined> | null;
        limits?: Record<string, QuantityInput | string | number | null | undefined> | null;
      }
    | KubernetesResourcesInput
    | null
    | undefined,
  paths: RequirementPaths,
): ParsedRequirements {
  const requests = parseList(resources?.requests, 'requests', paths);
  const limits = parseList(resources?.limits, 'limits', paths);
  for (const map of [requests, limits]) {
    for (const [key, { quantity, cls }] of map) {
      if (cls.kind === 'extended' && quantity.nanos % 1_000_000_000n !== 0n) {
        const which = map === requests ? 'requests' : 'limits';
        throw invalid(
          'SIZING_EXTENDED_NOT_INTEGER',
          `${paths.entry(which, key)} is ${quantity.text}; an extended resource is counted in whole units`,
          {
            details: { key },
          },
        );
      }
    }
  }
  for (const [key, request] of requests) {
    const limit = limits.get(key);
    if (limit === undefined) continue;
    if (limit.quantity.nanos < request.quantity.nanos) {
      throw invalid(
        'SIZING_LIMIT_BELOW_REQUEST',
        `${paths.entry('limits', key)} is ${limit.quantity.text}, below its request of ${request.quantity.text}`,
        { details: { key, request: request.quantity.text, limit: limit.quantity.text } },
      );
    }
    if (!isOvercommitAllowed(request.cls) && limit.quantity.nanos !== request.quantity.nanos) {
      throw invalid(
        'SIZING_REQUEST_NOT_EQUAL_LIMIT',
        `${paths.entry('requests', key)} is ${request.quantity.text} but its limit is ${limit.quantity.text}; ${key} cannot be overcommitted, so they must be equal`,
        { details: { key, request: request.quantity.text, limit: limit.quantity.text } },
      );
    }
  }
  return { requests, limits };
}

/** The API server's container defaulting: a resource with a limit and no request requests its limit. */
export function defaultRequestsToLimits(parsed: ParsedRequirements): ParsedRequirements {
  const requests = new Map(parsed.requests);
  for (const [key, limit] of parsed.limits) if (!requests.has(key)) requests.set(key, limit);
  return { requests, limits: parsed.limits };
}

/** Nanos per key. */
export function amountsOf(map: ReadonlyMap<string, ResourceAmount>): Map<string, bigint> {
  const out = new Map<string, bigint>();
  for (const [key, { quantity }] of map) out.set(key, quantity.nanos);
  return out;
}

/** A readable amount for messages: CPU in cores or millicores, sizes in Ki/Mi/Gi when exact. */
export function formatAmount(key: string, nanos: bigint): string {
  if (key === 'cpu') {
    const millis = (nanos + 999_999n) / 1_000_000n;
    return millis % 1000n === 0n ? String(millis / 1000n) : `${millis}m`;
  }
  const units = (nanos + 999_999_999n) / 1_000_000_000n;
  for (const [suffix, size] of [
    ['Gi', 1n << 30n],
    ['Mi', 1n << 20n],
    ['Ki', 1n << 10n],
  ] as const) {
    if (units !== 0n && units % size === 0n) return `${units / size}${suffix}`;
  }
  return String(units);
}
