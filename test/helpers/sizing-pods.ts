import { KataError } from '../../src/common/errors.js';
import { defaultConfig } from '../../src/config/defaults.js';
import { type ResolvedHandler, resolveHandler } from '../../src/config/handlers.js';
import type { KataConfig } from '../../src/config/types.js';
import type { ContainerResourceConfigInput, ContainerTypeName, PodSandboxConfigInput } from '../../src/sizing/input.js';

/** Helpers for building sizing inputs in the decoded CRI shape, tersely. */

export type Amounts = Record<string, string>;

export interface ContainerSpec {
  name: string;
  type?: ContainerTypeName | string | number;
  requests?: Amounts;
  limits?: Amounts;
}

function quantities(amounts: Amounts | undefined): Record<string, { string: string }> {
  return Object.fromEntries(Object.entries(amounts ?? {}).map(([k, v]) => [k, { string: v }]));
}

export function container(spec: ContainerSpec): ContainerResourceConfigInput {
  return {
    name: spec.name,
    type: spec.type ?? 'REGULAR_CONTAINER',
    kubernetes_resources: { requests: quantities(spec.requests), limits: quantities(spec.limits) },
    mounts: [],
    devices: [],
    CDI_devices: [],
  };
}

export function podWith(containers: ContainerSpec[], podLevel?: { requests?: Amounts; limits?: Amounts }): PodSandboxConfigInput {
  return {
    metadata: { name: 'test', namespace: 'default', uid: 'uid-1', attempt: 0 },
    annotations: {},
    linux: null,
    pod_resources: {
      containers: containers.map(container),
      kubernetes_resources:
        podLevel === undefined ? null : { requests: quantities(podLevel.requests), limits: quantities(podLevel.limits) },
    },
  };
}

export function handlerNamed(name = 'kata-ts', config: KataConfig = defaultConfig()): ResolvedHandler {
  return resolveHandler(config, name);
}

/** A roomy host, so that goldens do not depend on the machine running the tests. */
export const BIG_HOST = { cpus: 64, memoryMiB: 262_144 } as const;

/** Run `fn`, expect a KataError, return `kind/reason`. */
export function failureOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (err instanceof KataError) return `${err.kind}/${err.reason}`;
    throw err;
  }
  throw new Error('expected a KataError, got a result');
}
