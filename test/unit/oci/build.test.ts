import { describe, expect, it } from 'vitest';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import type { PodSandboxConfig__Output } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import {
  buildOciSpec,
  DEFAULT_MASKED_PATHS,
  DEFAULT_READONLY_PATHS,
  type OciContainerInput,
  type OciContainerSecurityInput,
  type OciSandboxInput,
  type OciSpecInput,
} from '../../../src/oci/index.js';
import { loadInput, thrown } from './load.js';

// A decoded CRI ContainerConfig / PodSandboxConfig must satisfy the narrow input as it is.
const _containerFits = (c: ContainerConfig__Output): OciContainerInput => c;
const _sandboxFits = (s: PodSandboxConfig__Output): OciSandboxInput => s;
void _containerFits;
void _sandboxFits;

function withSecurity(patch: OciContainerSecurityInput, base = 'busybox-default'): OciSpecInput {
  const input = loadInput(base);
  const linux = input.container.linux ?? {};
  input.container = { ...input.container, linux: { ...linux, security_context: { ...(linux.security_context ?? {}), ...patch } } };
  return input;
}

describe('buildOciSpec rules', () => {
  it('readonly rootfs and no_new_privs', () => {
    const { spec } = buildOciSpec(withSecurity({ readonly_rootfs: true, no_new_privs: true }));
    expect(spec.root.readonly).toBe(true);
    expect(spec.process!.noNewPrivileges).toBe(true);
  });

  it('masked and readonly paths: defaults when not given, none when given empty, as given otherwise', () => {
    const defaults = buildOciSpec(withSecurity({ masked_paths: null, readonly_paths: undefined })).spec.linux;
    expect(defaults!.maskedPaths).toEqual([...DEFAULT_MASKED_PATHS]);
    expect(defaults!.readonlyPaths).toEqual([...DEFAULT_READONLY_PATHS]);
    const none = buildOciSpec(withSecurity({ masked_paths: [], readonly_paths: [] })).spec.linux;
    expect(none!.maskedPaths).toBeUndefined();
    expect(none!.readonlyPaths).toBeUndefined();
    expect(buildOciSpec(withSecurity({ masked_paths: ['/proc/kcore'] })).spec.linux!.maskedPaths).toEqual(['/proc/kcore']);
    expect(thrown(() => buildOciSpec(withSecurity({ readonly_paths: ['proc/sys'] }))).reason).toBe('OCI_PATH_INVALID');
  });

  it('privileged: every capability, no masked/readonly paths, writable sysfs, all devices, no seccomp', () => {
    const input = withSecurity({ privileged: true, seccomp: { profile_type: 'RuntimeDefault' } });
    input.sandbox = { ...input.sandbox, linux: { ...input.sandbox.linux, security_context: { privileged: true } } };
    input.guest = { ...input.guest, privilegedDevices: [{ path: '/dev/vdb', type: 'b', major: 254, minor: 16 }] };
    const { spec } = buildOciSpec(input);
    expect(spec.process!.capabilities!.bounding).toContain('CAP_SYS_ADMIN');
    expect(spec.linux!.maskedPaths).toBeUndefined();
    expect(spec.linux!.readonlyPaths).toBeUndefined();
    expect(spec.linux!.seccomp).toBeUndefined();
    expect(spec.linux!.resources!.devices).toEqual([{ allow: true, access: 'rwm' }]);
    expect(spec.linux!.devices).toEqual([{ path: '/dev/vdb', type: 'b', major: 254, minor: 16 }]);
    expect(spec.mounts!.find((m) => m.destination === '/sys')?.options).not.toContain('ro');
  });

  it('a privileged container needs a privileged pod', () => {
    const err = thrown(() => buildOciSpec(withSecurity({ privileged: true })));
    expect(err.reason).toBe('OCI_PRIVILEGED_POD_REQUIRED');
    expect(err.message).toMatch(/^container\.linux\.security_context\.privileged /);
  });

  it('AppArmor: runtime default and unconfined are accepted, a specific profile refused', () => {
    for (const ok of [
      { apparmor: { profile_type: 'RuntimeDefault' as const } },
      { apparmor: { profile_type: 'Unconfined' as const } },
      { apparmor_profile: 'runtime/default' },
      { apparmor_profile: 'unconfined' },
    ]) {
      expect(() => buildOciSpec(withSecurity(ok))).not.toThrow();
    }
    const err = thrown(() => buildOciSpec(withSecurity({ apparmor: { profile_type: 'Localhost', localhost_ref: 'k8s-nginx' } })));
    expect(err.reason).toBe('OCI_APPARMOR_UNSUPPORTED');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^container\.linux\.security_context\.apparmor /);
    expect(thrown(() => buildOciSpec(withSecurity({ apparmor_profile: 'localhost/k8s-nginx' }))).message).toMatch(/apparmor_profile/);
  });

  it('SELinux: an empty option set is accepted, any label refused', () => {
    expect(() => buildOciSpec(withSecurity({ selinux_options: { user: '', role: '', type: '', level: '' } }))).not.toThrow();
    const err = thrown(() => buildOciSpec(withSecurity({ selinux_options: { level: 's0:c123,c456' } })));
    expect(err.reason).toBe('OCI_SELINUX_UNSUPPORTED');
    expect(err.message).toMatch(/^container\.linux\.security_context\.selinux_options /);
  });

  it("/dev/shm is the pod's, unless the request mounts its own", () => {
    const shm = (input: OciSpecInput) => buildOciSpec(input).spec.mounts!.filter((m) => m.destination === '/dev/shm');
    const input = loadInput('busybox-default');
    expect(shm(input)).toEqual([
      {
        destination: '/dev/shm',
        type: 'bind',
        source: '/run/kata-ts/sandbox/shm',
        options: ['rbind', 'rprivate', 'nosuid', 'nodev', 'noexec'],
      },
    ]);
    input.container = { ...input.container, mounts: [{ container_path: '/dev/shm', host_path: '/x', propagation: 'PROPAGATION_PRIVATE' }] };
    input.guest = { ...input.guest, mountSources: { '/dev/shm': '/g/shm' } };
    expect(shm(input).map((m) => m.source)).toEqual(['/g/shm']);
  });

  it('resources: CRI strings to numbers, unset fields left out, OOM score passed through', () => {
    const input = loadInput('busybox-default');
    input.container = {
      ...input.container,
      linux: {
        ...input.container.linux,
        resources: {
          cpu_shares: '512',
          cpu_quota: '-1',
          cpu_period: '0',
          memory_limit_in_bytes: '134217728',
          memory_swap_limit_in_bytes: '',
          oom_score_adj: '-500',
          cpuset_cpus: '1',
          hugepage_limits: [{ page_size: '2MB', limit: '4194304' }],
          unified: { 'pids.max': '100', 'memory.high': '1000000' },
        },
      },
    };
    const { spec } = buildOciSpec(input);
    expect(spec.linux!.resources).toEqual({
      devices: [{ allow: false, access: 'rwm' }],
      cpu: { shares: 512, quota: -1, cpus: '1' },
      memory: { limit: 134217728 },
      hugepageLimits: [{ pageSize: '2MB', limit: 4194304 }],
      unified: { 'memory.high': '1000000', 'pids.max': '100' },
    });
    expect(spec.process!.oomScoreAdj).toBe(-500);
  });

  it('resources: nonsense is refused naming the field', () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ cpu_shares: 'lots' }, 'cpu_shares'],
      [{ memory_limit_in_bytes: '-5' }, 'memory_limit_in_bytes'],
      [{ memory_limit_in_bytes: '99999999999999999999' }, 'memory_limit_in_bytes'],
      [{ oom_score_adj: '1001' }, 'oom_score_adj'],
      [{ hugepage_limits: [{ page_size: 'huge', limit: '1' }] }, 'hugepage_limits[0].page_size'],
    ];
    for (const [resources, field] of bad) {
      const input = loadInput('busybox-default');
      input.container = { ...input.container, linux: { ...input.container.linux, resources } };
      const err = thrown(() => buildOciSpec(input));
      expect(err.reason).toBe('OCI_RESOURCE_INVALID');
      expect(err.message.startsWith(`container.linux.resources.${field} `)).toBe(true);
    }
  });

  it('devices: a node per device and an allow rule after the deny-all; unknown ones refused', () => {
    const input = loadInput('busybox-default');
    input.container = { ...input.container, devices: [{ container_path: '/dev/fuse', host_path: '/dev/fuse', permissions: 'rw' }] };
    input.guest = { ...input.guest, devices: { '/dev/fuse': { type: 'c', major: 10, minor: 229, fileMode: 0o666 } } };
    const { spec } = buildOciSpec(input);
    expect(spec.linux!.devices).toEqual([{ path: '/dev/fuse', type: 'c', major: 10, minor: 229, fileMode: 0o666 }]);
    expect(spec.linux!.resources!.devices).toEqual([
      { allow: false, access: 'rwm' },
      { allow: true, type: 'c', major: 10, minor: 229, access: 'rw' },
    ]);
    input.container = { ...input.container, devices: [{ container_path: '/dev/fuse', permissions: 'rwx' }] };
    expect(thrown(() => buildOciSpec(input)).reason).toBe('OCI_DEVICE_INVALID');
    input.container = { ...input.container, devices: [{ container_path: '/dev/kvm' }] };
    expect(thrown(() => buildOciSpec(input)).reason).toBe('OCI_DEVICE_UNRESOLVED');
  });

  it('sysctls, hostname and annotations reach the spec', () => {
    const input = loadInput('busybox-default');
    input.sandbox = { ...input.sandbox, linux: { ...input.sandbox.linux, sysctls: { 'net.core.somaxconn': '1024' } } };
    const { spec } = buildOciSpec(input);
    expect(spec.linux!.sysctl).toEqual({ 'net.core.somaxconn': '1024' });
    expect(spec.hostname).toBe('sleeper');
    expect(spec.annotations?.['io.kubernetes.container.hash']).toBe('3f2a1b9c');
    expect(spec.linux!.cgroupsPath).toBe(input.guest.cgroupsPath);
    expect(spec.root.path).toBe(input.guest.rootfsPath);
  });

  it('a sandbox without hostname: no hostname, no /etc/hostname, no HOSTNAME', () => {
    const input = loadInput('busybox-default');
    input.sandbox = { ...input.sandbox, hostname: '' };
    const plan = buildOciSpec(input);
    expect(plan.spec.hostname).toBeUndefined();
    expect(plan.files.map((f) => f.containerPath)).toEqual(['/etc/resolv.conf']);
    expect(plan.spec.process!.env!.some((e) => e.startsWith('HOSTNAME='))).toBe(false);
  });

  it('the spec is JSON data: a round trip changes nothing', () => {
    const plan = buildOciSpec(loadInput('localhost-seccomp'));
    expect(JSON.parse(JSON.stringify(plan.spec))).toEqual(plan.spec);
  });
});
