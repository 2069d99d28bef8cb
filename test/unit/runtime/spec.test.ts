/** validate -> spec: what RunPodSandbox and CreateContainer accept, and the typed specs they make of it. */
import { describe, expect, it } from 'vitest';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import type { CreateContainerRequest__Output } from '../../../src/generated/runtime/v1/CreateContainerRequest.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import { announcedPodResources, decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { thrown } from '../../helpers/kata-error.js';

/** A ContainerConfig as grpc-js hands it to the handler (every field present, defaults filled). */
function containerConfig(json: Record<string, unknown>): ContainerConfig__Output | null {
  return decodeProtoJson<CreateContainerRequest__Output>('runtime.v1.CreateContainerRequest', { podSandboxId: 'x', config: json }).config;
}

function podConfig(json: Record<string, unknown>) {
  return decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', { config: json }).config;
}

describe('decodeSandboxSpec', () => {
  it('keeps the pod identity and the fields planning, records and status read; drops Windows', () => {
    const spec = decodeSandboxSpec(
      podConfig({
        metadata: { name: 'web', uid: 'u1', namespace: 'shop', attempt: 2 },
        hostname: 'web',
        logDirectory: '/var/log/pods/x',
        dnsConfig: { servers: ['10.0.0.10'] },
        portMappings: [{ protocol: 'TCP', containerPort: 80 }],
        linux: { cgroupParent: '/kubepods/podu1' },
        windows: {},
        podResources: { containers: [{ name: 'app' }] },
      }),
    );
    expect(spec.metadata).toEqual({ name: 'web', uid: 'u1', namespace: 'shop', attempt: 2 });
    expect([spec.hostname, spec.log_directory, spec.dns_config?.servers]).toEqual(['web', '/var/log/pods/x', ['10.0.0.10']]);
    expect(spec.port_mappings).toEqual([{ protocol: 'TCP', container_port: 80, host_port: 0, host_ip: '' }]);
    expect(spec.linux?.cgroup_parent).toBe('/kubepods/podu1');
    expect(spec).not.toHaveProperty('windows');
    expect(announcedPodResources(spec)?.containers.map((c) => c.name)).toEqual(['app']);
  });

  it('a pod_resources naming no container announces nothing', () => {
    const spec = decodeSandboxSpec(podConfig({ metadata: { name: 'a', uid: 'u', namespace: 'n' }, podResources: {} }));
    expect(announcedPodResources(spec)).toBeUndefined();
  });

  it('refuses a missing config, missing metadata and each empty identity field', () => {
    expect(thrown(() => decodeSandboxSpec(null)).reason).toBe('SANDBOX_CONFIG_MISSING');
    expect(thrown(() => decodeSandboxSpec(podConfig({}))).reason).toBe('SANDBOX_METADATA_MISSING');
    for (const field of ['name', 'uid', 'namespace']) {
      const metadata = { name: 'a', uid: 'u', namespace: 'n', [field]: '' };
      const err = thrown(() => decodeSandboxSpec(podConfig({ metadata })));
      expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_METADATA_INVALID']);
      expect(err.message).toContain(`config.metadata.${field}`);
    }
  });
});

describe('decodeSandboxSpec: host namespaces a pod VM cannot join', () => {
  const metadata = { name: 'a', uid: 'u', namespace: 'n' };
  const withNamespaces = (namespaceOptions: Record<string, unknown>) =>
    podConfig({ metadata, linux: { securityContext: { namespaceOptions } } });

  it('refuses host network and host IPC with INVALID_ARGUMENT naming the field', () => {
    for (const [key, opts] of [
      ['network', { network: 'NODE', pid: 'POD', ipc: 'POD' }],
      ['ipc', { network: 'POD', pid: 'POD', ipc: 'NODE' }],
    ] as const) {
      const err = thrown(() => decodeSandboxSpec(withNamespaces(opts)));
      expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_HOST_NAMESPACE_UNSUPPORTED']);
      expect(err.message).toContain(`config.linux.security_context.namespace_options.${key} is NODE`);
    }
  });

  it('accepts host PID (the guest root PID namespace) and pod namespaces', () => {
    expect(decodeSandboxSpec(withNamespaces({ network: 'POD', pid: 'NODE', ipc: 'POD' })).metadata.name).toBe('a');
  });

  it('does not judge again the config of a sandbox already recorded', () => {
    expect(decodeSandboxSpec(withNamespaces({ network: 'NODE' }), { recorded: true }).metadata.name).toBe('a');
  });
});

describe('decodeContainerSpec', () => {
  const base = { metadata: { name: 'app', attempt: 1 }, image: { image: 'busybox' } };

  it('keeps what the OCI spec and admission need, typed', () => {
    const spec = decodeContainerSpec(
      containerConfig({
        ...base,
        command: ['sh'],
        args: ['-c', 'true'],
        workingDir: '/w',
        envs: [{ key: 'A', value: '1' }],
        mounts: [{ containerPath: '/data', hostPath: '/h', readonly: true }],
        devices: [{ containerPath: '/dev/x', hostPath: '/dev/x', permissions: 'rw' }],
        CDIDevices: [{ name: 'vendor.com/gpu=0' }],
        logPath: 'app/1.log',
        tty: true,
        stdin: true,
        stdinOnce: true,
        linux: {
          resources: { memoryLimitInBytes: '1048576' },
          securityContext: { runAsUser: { value: '1000' }, runAsGroup: { value: '1000' } },
        },
        windows: {},
        stopSignal: 'SIGTERM',
      }),
    );
    expect(spec.metadata).toEqual({ name: 'app', attempt: 1 });
    expect(spec.image.image).toBe('busybox');
    expect([spec.command, spec.args, spec.working_dir, spec.log_path]).toEqual([['sh'], ['-c', 'true'], '/w', 'app/1.log']);
    expect([spec.tty, spec.stdin, spec.stdin_once]).toEqual([true, true, true]);
    expect(spec.envs).toEqual([{ key: 'A', value: '1' }]);
    expect(spec.mounts[0]).toMatchObject({ container_path: '/data', host_path: '/h', readonly: true });
    expect(spec.devices[0]).toMatchObject({ container_path: '/dev/x', permissions: 'rw' });
    expect(spec.CDI_devices).toEqual([{ name: 'vendor.com/gpu=0' }]);
    expect(spec.linux?.resources?.memory_limit_in_bytes).toBe('1048576');
    expect(spec.linux?.security_context?.run_as_group).toEqual({ value: '1000' });
    expect(spec.stop_signal).toBe('SIGTERM');
    expect(spec).not.toHaveProperty('windows');
  });

  it('refuses a missing config, an empty name and an empty image', () => {
    expect(thrown(() => decodeContainerSpec(null)).reason).toBe('CONTAINER_CONFIG_MISSING');
    expect(thrown(() => decodeContainerSpec(containerConfig({ image: base.image }))).reason).toBe('CONTAINER_METADATA_INVALID');
    expect(thrown(() => decodeContainerSpec(containerConfig({ metadata: base.metadata }))).reason).toBe('CONTAINER_IMAGE_MISSING');
  });

  it('refuses run_as_group without run_as_user or run_as_username, naming the field', () => {
    const err = thrown(() => decodeContainerSpec(containerConfig({ ...base, linux: { securityContext: { runAsGroup: { value: '0' } } } })));
    expect([err.kind, err.reason]).toEqual(['invalid', 'CONTAINER_RUN_AS_GROUP_WITHOUT_USER']);
    expect(err.message).toContain('config.linux.security_context.run_as_group');
  });

  it('accepts run_as_group with run_as_user, with run_as_username, and a user alone', () => {
    const withGroup = (sc: Record<string, unknown>) =>
      decodeContainerSpec(containerConfig({ ...base, linux: { securityContext: { runAsGroup: { value: '5' }, ...sc } } }));
    expect(withGroup({ runAsUser: { value: '0' } }).linux?.security_context?.run_as_user).toEqual({ value: '0' });
    expect(withGroup({ runAsUsername: 'nginx' }).linux?.security_context?.run_as_username).toBe('nginx');
    const userOnly = decodeContainerSpec(containerConfig({ ...base, linux: { securityContext: { runAsUser: { value: '7' } } } }));
    expect(userOnly.linux?.security_context?.run_as_group).toBeNull();
  });

  it('keeps a log path inside the pod log directory: relative, no ".." segment, no NUL', () => {
    // Too long for open(2) (a segment over NAME_MAX, or the whole too long): refused here, not at start.
    for (const logPath of [
      '../../etc/cron.d/x',
      'app/../../x',
      '/etc/passwd',
      'a\u0000b',
      `${'z'.repeat(256)}.log`,
      'a/'.repeat(600),
      '.',
      'app/',
      'app/.',
    ]) {
      const err = thrown(() => decodeContainerSpec(containerConfig({ ...base, logPath })));
      expect([err.kind, err.reason, err.message]).toEqual([
        'invalid',
        'CONTAINER_LOG_PATH_INVALID',
        expect.stringContaining('config.log_path'),
      ]);
    }
    expect(decodeContainerSpec(containerConfig({ ...base, logPath: 'app/0.log' })).log_path).toBe('app/0.log');
    expect(decodeContainerSpec(containerConfig({ ...base, logPath: 'a..b/0.log' })).log_path).toBe('a..b/0.log');
    expect(decodeContainerSpec(containerConfig({ ...base, logPath: `${'é'.repeat(125)}/0.log` })).log_path).toHaveLength(131);
  });
});

describe('decodeSandboxSpec: log_directory', () => {
  const pod = { metadata: { name: 'p', namespace: 'n', uid: 'u' } };
  it('is empty or an absolute path without ".." segments', () => {
    for (const logDirectory of ['relative/dir', '/var/log/pods/../../etc', '/var/log/\u0000x']) {
      const err = thrown(() => decodeSandboxSpec(podConfig({ ...pod, logDirectory })));
      expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_LOG_DIRECTORY_INVALID']);
    }
    expect(decodeSandboxSpec(podConfig({ ...pod, logDirectory: '/var/log/pods/n_p_u' })).log_directory).toBe('/var/log/pods/n_p_u');
    expect(decodeSandboxSpec(podConfig(pod)).log_directory).toBe('');
  });
});
