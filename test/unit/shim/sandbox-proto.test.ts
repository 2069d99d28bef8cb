/**
 * containerd 2.x's Sandbox API (proto/containerd/runtime/sandbox/v1/sandbox.proto, with the
 * Platform and Metric types): field numbers and wire types checked against bytes built by hand,
 * the service's nine methods with their messages, and CreateSandboxRequest carrying the CRI's
 * PodSandboxConfig in `options`, as containerd's shim sandboxer sends it.
 */
import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { criReflectionRoot } from '../../../src/cri/proto.js';
import { CONTAINERD_SERVICES } from '../../../src/generated/containerd/containerd.js';
import { decodeMessage, encodeMessage } from '../../../src/shim/proto.js';
import { cat, lfield, vfield } from './wire.js';

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const SERVICE = 'containerd.runtime.sandbox.v1.Sandbox';

describe('containerd.runtime.sandbox.v1.Sandbox', () => {
  it('has the nine methods of containerd v2.1.9, each with its request and response', () => {
    const methods = CONTAINERD_SERVICES[SERVICE];
    expect(Object.keys(methods).sort()).toEqual(
      [
        'CreateSandbox',
        'StartSandbox',
        'Platform',
        'StopSandbox',
        'WaitSandbox',
        'SandboxStatus',
        'PingSandbox',
        'ShutdownSandbox',
        'SandboxMetrics',
      ].sort(),
    );
    expect(methods.PingSandbox).toEqual({
      request: 'containerd.runtime.sandbox.v1.PingRequest',
      response: 'containerd.runtime.sandbox.v1.PingResponse',
    });
    expect(methods.Platform.response).toBe('containerd.runtime.sandbox.v1.PlatformResponse');
  });

  it('CreateSandboxRequest: id 1, bundle 2, rootfs 3, options 4 (an Any), netns 5, annotations 6 (a map)', () => {
    // The pod config as the CRI face's own schema encodes it (proto/api.proto): what the Any holds.
    const PodSandboxConfig = criReflectionRoot().lookupType('runtime.v1.PodSandboxConfig');
    const pod = PodSandboxConfig.encode(
      PodSandboxConfig.fromObject({
        metadata: { name: 'web', uid: 'u1', namespace: 'default' },
        linux: { resources: { cpu_quota: 150000, cpu_period: 100000, memory_limit_in_bytes: 268435456 } },
      }),
    ).finish();
    const bytes = cat(
      lfield(1, 'sb1'),
      lfield(2, '/state/io.containerd.sandbox.controller.v1.shim/k8s.io/sb1'),
      lfield(3, cat(lfield(1, 'bind'), lfield(2, '/src'), lfield(4, 'rbind'))),
      lfield(4, cat(lfield(1, 'runtime.v1.PodSandboxConfig'), lfield(2, Buffer.from(pod)))),
      lfield(5, '/state/io.containerd.grpc.v1.cri/netns/cni-1'),
      lfield(6, cat(lfield(1, 'k'), lfield(2, 'v'))),
    );
    const req = decodeMessage('containerd.runtime.sandbox.v1.CreateSandboxRequest', bytes);
    expect(req).toMatchObject({
      sandbox_id: 'sb1',
      bundle_path: '/state/io.containerd.sandbox.controller.v1.shim/k8s.io/sb1',
      rootfs: [{ type: 'bind', source: '/src', target: '', options: ['rbind'] }],
      netns_path: '/state/io.containerd.grpc.v1.cri/netns/cni-1',
      annotations: { k: 'v' },
    });
    expect(req.options?.type_url).toBe('runtime.v1.PodSandboxConfig');
    const back = PodSandboxConfig.toObject(PodSandboxConfig.decode(req.options!.value), { longs: String });
    expect(back).toMatchObject({
      metadata: { name: 'web', uid: 'u1' },
      linux: { resources: { cpu_quota: '150000', memory_limit_in_bytes: '268435456' } },
    });
    // Re-encoded, the same bytes (proto3: defaults left out).
    expect(hex(encodeMessage('containerd.runtime.sandbox.v1.CreateSandboxRequest', req))).toBe(hex(bytes));
  });

  it('StartSandboxResponse: pid 1 (varint), created_at 2; WaitSandboxResponse: exit_status 1, exited_at 2', () => {
    const ts = cat(vfield(1, 1_700_000_000), vfield(2, 5));
    expect(
      hex(
        encodeMessage('containerd.runtime.sandbox.v1.StartSandboxResponse', {
          pid: 4242,
          created_at: { seconds: '1700000000', nanos: 5 },
        }),
      ),
    ).toBe(hex(cat(vfield(1, 4242), lfield(2, ts))));
    expect(
      hex(
        encodeMessage('containerd.runtime.sandbox.v1.WaitSandboxResponse', {
          exit_status: 137,
          exited_at: { seconds: '1700000000', nanos: 5 },
        }),
      ),
    ).toBe(hex(cat(vfield(1, 137), lfield(2, ts))));
    expect(hex(encodeMessage('containerd.runtime.sandbox.v1.StopSandboxRequest', { sandbox_id: 's', timeout_secs: 30 }))).toBe(
      hex(cat(lfield(1, 's'), vfield(2, 30))),
    );
  });

  it('SandboxStatusResponse: id 1, pid 2, state 3, info 4, created_at 5, exited_at 6, extra 7', () => {
    const bytes = cat(
      lfield(1, 'sb1'),
      vfield(2, 77),
      lfield(3, 'SANDBOX_READY'),
      lfield(4, cat(lfield(1, 'vm'), lfield(2, 'qemu'))),
      lfield(5, vfield(1, 10)),
      lfield(6, vfield(1, 20)),
      lfield(7, cat(lfield(1, 'x.y.Z'), lfield(2, Buffer.from([1])))),
    );
    const res = decodeMessage('containerd.runtime.sandbox.v1.SandboxStatusResponse', bytes);
    expect(res).toMatchObject({
      sandbox_id: 'sb1',
      pid: 77,
      state: 'SANDBOX_READY',
      info: { vm: 'qemu' },
      created_at: { seconds: '10' },
      exited_at: { seconds: '20' },
      extra: { type_url: 'x.y.Z' },
    });
  });

  it('PlatformResponse: a containerd.types.Platform (os 1, architecture 2, variant 3, os_version 4)', () => {
    const bytes = encodeMessage('containerd.runtime.sandbox.v1.PlatformResponse', { platform: { os: 'linux', architecture: 'amd64' } });
    expect(hex(bytes)).toBe(hex(lfield(1, cat(lfield(1, 'linux'), lfield(2, 'amd64')))));
    const full = decodeMessage('containerd.types.Platform', cat(lfield(3, 'v8'), lfield(4, '10.0')));
    expect(full).toMatchObject({ variant: 'v8', os_version: '10.0' });
  });

  it('SandboxMetricsResponse: a containerd.types.Metric (timestamp 1, id 2, data 3)', () => {
    const bytes = cat(
      lfield(1, cat(lfield(1, vfield(1, 9)), lfield(2, 'sb1'), lfield(3, cat(lfield(1, 'io.containerd.cgroups.v1.Metrics'))))),
    );
    const res = decodeMessage('containerd.runtime.sandbox.v1.SandboxMetricsResponse', bytes);
    expect(res.metrics).toMatchObject({ timestamp: { seconds: '9' }, id: 'sb1', data: { type_url: 'io.containerd.cgroups.v1.Metrics' } });
  });
});
