/**
 * The CRI decoders: a request decoded once into the core's typed values, refusals from the
 * core's validators unchanged, CRI filters turned into neutral ones that select what the CRI
 * filter selected.
 */
import { describe, expect, it } from 'vitest';
import { decodeContainerFilter, decodeContainerStatsFilter, decodeCreateContainer } from '../../../src/cri/decode/container.js';
import { decodeRunPodSandbox, decodeSandboxFilter, decodeSandboxStatsFilter } from '../../../src/cri/decode/sandbox.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { CreateContainerRequest__Output } from '../../../src/generated/runtime/v1/CreateContainerRequest.js';
import type { ListContainerStatsRequest__Output } from '../../../src/generated/runtime/v1/ListContainerStatsRequest.js';
import type { ListContainersRequest__Output } from '../../../src/generated/runtime/v1/ListContainersRequest.js';
import type { ListPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/ListPodSandboxRequest.js';
import type { ListPodSandboxStatsRequest__Output } from '../../../src/generated/runtime/v1/ListPodSandboxStatsRequest.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { containerMatches } from '../../../src/runtime/container/filter.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import { sandboxMatches } from '../../../src/runtime/sandbox/filter.js';
import type { SandboxRecord } from '../../../src/runtime/sandbox/record.js';

const decode = <T>(type: string, json: object) => decodeProtoJson<T>(`runtime.v1.${type}`, json);

const sandbox = (id: string, state: SandboxRecord['state'], labels: Record<string, string>) => ({ id, state, labels }) as SandboxRecord;
const container = (id: string, sandboxId: string, state: ContainerRecord['state'], labels: Record<string, string>) =>
  ({ id, sandboxId, state, labels }) as ContainerRecord;

describe('RunPodSandbox and CreateContainer decoding', () => {
  it('gives the spec and the handler name', () => {
    const req = decode<RunPodSandboxRequest__Output>('RunPodSandboxRequest', {
      config: { metadata: { name: 'p', namespace: 'ns', uid: 'u' } },
      runtimeHandler: 'kata',
    });
    const { spec, runtimeHandler } = decodeRunPodSandbox(req);
    expect(runtimeHandler).toBe('kata');
    expect(spec.metadata).toEqual({ name: 'p', namespace: 'ns', uid: 'u', attempt: 0 });
  });

  it("keeps the core validator's refusals (code and reason)", () => {
    const noConfig = decode<RunPodSandboxRequest__Output>('RunPodSandboxRequest', {});
    expect(() => decodeRunPodSandbox(noConfig)).toThrow(expect.objectContaining({ kind: 'invalid', reason: 'SANDBOX_CONFIG_MISSING' }));
    const noImage = decode<CreateContainerRequest__Output>('CreateContainerRequest', {
      podSandboxId: 's',
      config: { metadata: { name: 'c' } },
    });
    expect(() => decodeCreateContainer(noImage)).toThrow(expect.objectContaining({ kind: 'invalid' }));
  });

  it('gives the sandbox id and the container spec', () => {
    const req = decode<CreateContainerRequest__Output>('CreateContainerRequest', {
      podSandboxId: 'abc',
      config: { metadata: { name: 'c' }, image: { image: 'app:1' } },
    });
    const { sandboxId, spec } = decodeCreateContainer(req);
    expect(sandboxId).toBe('abc');
    expect(spec.image.image).toBe('app:1');
  });
});

describe('CRI filters as neutral filters', () => {
  const sandboxes = [sandbox('aaa1', 'SANDBOX_READY', { app: 'x' }), sandbox('bbb2', 'SANDBOX_NOTREADY', { app: 'y' })];
  const containers = [
    container('c1', 'aaa1', 'CONTAINER_RUNNING', { app: 'x' }),
    container('c2', 'bbb2', 'CONTAINER_EXITED', { app: 'x' }),
    container('d3', 'aaa1', 'CONTAINER_CREATED', { app: 'y' }),
  ];
  const ids = (rs: Array<{ id: string }>) => rs.map((r) => r.id);

  it('ListPodSandbox: no filter, id prefix, state, labels', () => {
    const pick = (filter: object | undefined) => {
      const f = decodeSandboxFilter(decode<ListPodSandboxRequest__Output>('ListPodSandboxRequest', filter === undefined ? {} : { filter }));
      return ids(sandboxes.filter((s) => sandboxMatches(s, f)));
    };
    expect(pick(undefined)).toEqual(['aaa1', 'bbb2']);
    expect(pick({ id: 'bb' })).toEqual(['bbb2']);
    expect(pick({ state: { state: 'SANDBOX_READY' } })).toEqual(['aaa1']);
    expect(pick({ labelSelector: { app: 'y' } })).toEqual(['bbb2']);
    expect(pick({ id: 'aa', labelSelector: { app: 'y' } })).toEqual([]);
  });

  it('ListPodSandboxStats: id prefix and labels', () => {
    const f = decodeSandboxStatsFilter(
      decode<ListPodSandboxStatsRequest__Output>('ListPodSandboxStatsRequest', { filter: { labelSelector: { app: 'x' } } }),
    );
    expect(ids(sandboxes.filter((s) => sandboxMatches(s, f)))).toEqual(['aaa1']);
  });

  it('ListContainers: sandbox prefix, state (UNKNOWN matches none), labels', () => {
    const pick = (filter: object) => {
      const f = decodeContainerFilter(decode<ListContainersRequest__Output>('ListContainersRequest', { filter }));
      return ids(containers.filter((c) => containerMatches(c, f)));
    };
    expect(pick({})).toEqual(['c1', 'c2', 'd3']);
    expect(pick({ podSandboxId: 'aa' })).toEqual(['c1', 'd3']);
    expect(pick({ id: 'c' })).toEqual(['c1', 'c2']);
    expect(pick({ state: { state: 'CONTAINER_EXITED' } })).toEqual(['c2']);
    expect(pick({ state: { state: 'CONTAINER_UNKNOWN' } })).toEqual([]);
    expect(pick({ labelSelector: { app: 'x' }, podSandboxId: 'aaa1' })).toEqual(['c1']);
  });

  it('ListContainerStats: id, sandbox and labels', () => {
    const f = decodeContainerStatsFilter(
      decode<ListContainerStatsRequest__Output>('ListContainerStatsRequest', {
        filter: { podSandboxId: 'aaa1', labelSelector: { app: 'y' } },
      }),
    );
    expect(ids(containers.filter((c) => containerMatches(c, f)))).toEqual(['d3']);
  });
});
