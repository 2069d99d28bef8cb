/**
 * The Sandbox API's pure parts (src/shim/sandbox-service.ts): the pod config in CreateSandbox's
 * `options` decoded as the CRI face decodes RunPodSandbox's, refusals naming the field, and the
 * platform's GOARCH spelling; and the bundle containerd 2.x's shim sandboxer starts the shim in
 * (no config.json) read as a sandbox of its own. The service over a real containerd and VM is
 * test/integration/shim/containerd-versions.test.ts.
 */
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { criReflectionRoot } from '../../../src/cri/proto.js';
import { readBundleConfig, taskRole } from '../../../src/shim/bundle.js';
import { decodePodSandboxOptions, goArch, POD_SANDBOX_CONFIG_TYPE_URL } from '../../../src/shim/sandbox-service.js';
import { thrown } from '../../helpers/kata-error.js';

const PodSandboxConfig = criReflectionRoot().lookupType('runtime.v1.PodSandboxConfig');
const encode = (o: Record<string, unknown>) => PodSandboxConfig.encode(PodSandboxConfig.fromObject(o)).finish();

describe('decodePodSandboxOptions', () => {
  it('gives the CRI face shape: snake_case, int64 as decimal strings, enums by name, every field present', () => {
    const spec = decodePodSandboxOptions({
      type_url: POD_SANDBOX_CONFIG_TYPE_URL,
      value: encode({
        metadata: { name: 'web', uid: 'u1', namespace: 'default' },
        linux: {
          cgroup_parent: '/kubepods/podu1',
          resources: { cpu_quota: 150000, cpu_period: 100000, memory_limit_in_bytes: 268435456 },
          security_context: { namespace_options: { network: 2 } },
        },
      }),
    });
    expect(spec.metadata).toEqual({ name: 'web', uid: 'u1', namespace: 'default', attempt: 0 });
    expect(spec.linux?.resources).toMatchObject({ cpu_quota: '150000', cpu_period: '100000', memory_limit_in_bytes: '268435456' });
    expect(spec.linux?.security_context?.namespace_options?.network).toBe('NODE');
    expect(spec.port_mappings).toEqual([]);
    expect(spec.hostname).toBe('');
  });

  it('accepts a prefixed type url (type.googleapis.com/...)', () => {
    const spec = decodePodSandboxOptions({
      type_url: `type.googleapis.com/${POD_SANDBOX_CONFIG_TYPE_URL}`,
      value: encode({ hostname: 'h' }),
    });
    expect(spec.hostname).toBe('h');
  });

  it('refuses, naming CreateSandboxRequest.options: none, another type, bytes that do not decode', () => {
    expect(thrown(() => decodePodSandboxOptions(null))).toMatchObject({ reason: 'SHIM_SANDBOX_OPTIONS_INVALID', kind: 'invalid' });
    const other = thrown(() => decodePodSandboxOptions({ type_url: 'containerd.runc.v1.Options', value: new Uint8Array() }));
    expect(other).toMatchObject({ reason: 'SHIM_SANDBOX_OPTIONS_INVALID' });
    expect(other.message).toContain('CreateSandboxRequest.options is a containerd.runc.v1.Options');
    const garbage = thrown(() =>
      decodePodSandboxOptions({ type_url: POD_SANDBOX_CONFIG_TYPE_URL, value: Uint8Array.from([0x0a, 0x05, 0x01]) }),
    );
    expect(garbage.message).toContain('CreateSandboxRequest.options does not decode');
  });
});

describe('goArch', () => {
  it("spells Node's architectures as GOARCH", () => {
    expect([goArch('x64'), goArch('arm64'), goArch('ppc64'), goArch('s390x')]).toEqual(['amd64', 'arm64', 'ppc64le', 's390x']);
  });
});

describe("the shim sandboxer's bundle", () => {
  const roots: string[] = [];
  afterAll(async () => {
    for (const r of roots) await rm(r, { recursive: true, force: true });
  });

  it('a bundle under io.containerd.sandbox.controller.v1.shim without config.json is a sandbox of its own', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'kts-sbx-bundle-'));
    roots.push(root);
    const bundle = path.join(root, 'io.containerd.sandbox.controller.v1.shim', 'k8s.io', 'sb1');
    await mkdir(bundle, { recursive: true });
    const config = await readBundleConfig(bundle);
    expect(config).toEqual({ annotations: {}, cgroupsPath: null });
    expect(taskRole('sb1', config.annotations)).toEqual({ role: 'sandbox', sandboxId: 'sb1' });
  });

  it('anywhere else a missing config.json is still refused', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'kts-sbx-bundle-'));
    roots.push(root);
    const bundle = path.join(root, 'io.containerd.runtime.v2.task', 'k8s.io', 'c1');
    await mkdir(bundle, { recursive: true });
    await expect(readBundleConfig(bundle)).rejects.toThrow(/config.json does not exist/);
  });
});
