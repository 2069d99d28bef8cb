import { describe, expect, it } from 'vitest';
import { DEFAULT_CAPABILITIES } from '../../../src/oci/capabilities.js';
import { runtimeDefaultProfile } from '../../../src/oci/seccomp-default.js';
import { parseLocalhostProfile } from '../../../src/oci/seccomp-localhost.js';
import { resolveSeccomp, seccompLocalhostRef } from '../../../src/oci/security.js';
import type { OciSeccomp } from '../../../src/oci/spec-types.js';
import { thrown } from './load.js';

const denied = (p: OciSeccomp): Set<string> => new Set((p.syscalls ?? []).filter((s) => s.args === undefined).flatMap((s) => s.names));

describe('RuntimeDefault profile', () => {
  const base = runtimeDefaultProfile(DEFAULT_CAPABILITIES);
  it('allows by default and denies with EPERM', () => {
    expect(base.defaultAction).toBe('SCMP_ACT_ALLOW');
    expect(base.architectures).toEqual(['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32']);
    for (const s of base.syscalls ?? []) {
      expect(s.action).toBe('SCMP_ACT_ERRNO');
      expect(s.errnoRet).toBe(s.names.includes('clone3') ? 38 : 1);
    }
  });
  it('denies module loading, kexec, keyrings, io_uring, mount, unshare, bpf for a default container', () => {
    const d = denied(base);
    for (const name of [
      'init_module',
      'kexec_load',
      'keyctl',
      'io_uring_setup',
      'mount',
      'unshare',
      'setns',
      'bpf',
      'reboot',
      'clock_settime',
    ]) {
      expect(d.has(name), name).toBe(true);
    }
    for (const name of ['read', 'write', 'openat', 'clone', 'execve', 'ptrace', 'chown']) expect(d.has(name), name).toBe(false);
  });
  it('refuses clone with each namespace flag', () => {
    const cloneRules = (base.syscalls ?? []).filter((s) => s.names.includes('clone'));
    expect(cloneRules).toHaveLength(7);
    for (const r of cloneRules) expect(r.args?.[0]).toMatchObject({ index: 0, op: 'SCMP_CMP_MASKED_EQ' });
    // CLONE_NEWUSER among them
    expect(cloneRules.some((r) => r.args?.[0]?.value === 0x10000000)).toBe(true);
  });
  it('a granted capability opens its group', () => {
    const d = denied(runtimeDefaultProfile([...DEFAULT_CAPABILITIES, 'CAP_SYS_ADMIN', 'CAP_SYS_TIME']));
    expect(d.has('mount')).toBe(false);
    expect(d.has('clock_settime')).toBe(false);
    expect(d.has('bpf')).toBe(false);
    expect(d.has('kexec_load')).toBe(true);
    const withAdmin = runtimeDefaultProfile(['CAP_SYS_ADMIN']);
    expect((withAdmin.syscalls ?? []).some((s) => s.names.includes('clone'))).toBe(false);
    expect(denied(runtimeDefaultProfile(['CAP_BPF'])).has('bpf')).toBe(false);
  });
});

describe('seccomp choice', () => {
  it('nothing asked, Unconfined, legacy "unconfined": no filter', () => {
    expect(resolveSeccomp(null, [], undefined)).toBeUndefined();
    expect(resolveSeccomp({ seccomp: { profile_type: 'Unconfined' } }, [], undefined)).toBeUndefined();
    expect(resolveSeccomp({ seccomp_profile_path: 'unconfined' }, [], undefined)).toBeUndefined();
  });
  it('RuntimeDefault, structured or legacy', () => {
    expect(resolveSeccomp({ seccomp: { profile_type: 'RuntimeDefault' } }, [], undefined)?.defaultAction).toBe('SCMP_ACT_ALLOW');
    expect(resolveSeccomp({ seccomp_profile_path: 'runtime/default' }, [], undefined)?.defaultAction).toBe('SCMP_ACT_ALLOW');
    expect(resolveSeccomp({ seccomp_profile_path: 'docker/default' }, [], undefined)?.defaultAction).toBe('SCMP_ACT_ALLOW');
  });
  it('privileged runs unconfined, as Kubernetes documents', () => {
    expect(resolveSeccomp({ privileged: true, seccomp: { profile_type: 'RuntimeDefault' } }, [], undefined)).toBeUndefined();
  });
  it('Localhost needs its content passed in', () => {
    const sc = { seccomp: { profile_type: 'Localhost' as const, localhost_ref: '/var/lib/kubelet/seccomp/x.json' } };
    expect(seccompLocalhostRef(sc)).toBe('/var/lib/kubelet/seccomp/x.json');
    expect(seccompLocalhostRef({ seccomp_profile_path: 'localhost/y.json' })).toBe('y.json');
    expect(seccompLocalhostRef(null)).toBeUndefined();
    const err = thrown(() => resolveSeccomp(sc, [], undefined));
    expect(err.reason).toBe('OCI_SECCOMP_PROFILE_MISSING');
    expect(err.message).toMatch(/^container\.linux\.security_context\.seccomp\.localhost_ref /);
    expect(resolveSeccomp(sc, [], '{"defaultAction":"SCMP_ACT_LOG"}')).toEqual({ defaultAction: 'SCMP_ACT_LOG', syscalls: [] });
  });
  it('Localhost without a ref, and unknown legacy strings, are refused', () => {
    expect(thrown(() => resolveSeccomp({ seccomp: { profile_type: 'Localhost', localhost_ref: '' } }, [], '{}')).reason).toBe(
      'OCI_PROFILE_REF_MISSING',
    );
    expect(thrown(() => resolveSeccomp({ seccomp_profile_path: 'strict' }, [], undefined)).reason).toBe('OCI_PROFILE_UNKNOWN');
  });
});

describe('Localhost profile parsing', () => {
  const field = 'container.linux.security_context.seccomp.localhost_ref';
  const parse = (doc: unknown, caps: string[] = []) => parseLocalhostProfile(JSON.stringify(doc), field, caps);

  it('keeps the OCI shape and turns name/archMap into names/architectures', () => {
    const p = parse({
      defaultAction: 'SCMP_ACT_ERRNO',
      defaultErrnoRet: 1,
      archMap: [{ architecture: 'SCMP_ARCH_X86_64', subArchitectures: ['SCMP_ARCH_X86'] }],
      flags: ['SECCOMP_FILTER_FLAG_LOG'],
      syscalls: [
        { name: 'read', action: 'SCMP_ACT_ALLOW' },
        { names: ['personality'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value: 8, op: 'SCMP_CMP_EQ' }] },
      ],
    });
    expect(p).toEqual({
      defaultAction: 'SCMP_ACT_ERRNO',
      defaultErrnoRet: 1,
      architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86'],
      flags: ['SECCOMP_FILTER_FLAG_LOG'],
      syscalls: [
        { names: ['read'], action: 'SCMP_ACT_ALLOW' },
        { names: ['personality'], action: 'SCMP_ACT_ALLOW', args: [{ index: 0, value: 8, op: 'SCMP_CMP_EQ' }] },
      ],
    });
  });
  it('applies includes/excludes by capability and architecture', () => {
    const doc = {
      defaultAction: 'SCMP_ACT_ERRNO',
      syscalls: [
        { names: ['a'], action: 'SCMP_ACT_ALLOW', includes: { caps: ['CAP_SYS_ADMIN'] } },
        { names: ['b'], action: 'SCMP_ACT_ALLOW', excludes: { caps: ['CAP_SYS_ADMIN'] } },
        { names: ['c'], action: 'SCMP_ACT_ALLOW', includes: { arches: ['s390x'] } },
        { names: ['d'], action: 'SCMP_ACT_ALLOW', includes: { arches: ['amd64'] } },
        { names: ['e'], action: 'SCMP_ACT_ALLOW', excludes: { arches: ['amd64'] } },
      ],
    };
    expect(parse(doc).syscalls?.flatMap((s) => s.names)).toEqual(['b', 'd']);
    expect(parse(doc, ['CAP_SYS_ADMIN']).syscalls?.flatMap((s) => s.names)).toEqual(['a', 'd']);
  });
  it('refuses what is not JSON, unknown keys, unknown actions, NOTIFY, nameless rules, bad arg indexes', () => {
    expect(thrown(() => parseLocalhostProfile('{nope', field, [])).reason).toBe('OCI_SECCOMP_PROFILE_INVALID');
    const bad: unknown[] = [
      {},
      { defaultAction: 'SCMP_ACT_ALLOW', surprise: 1 },
      { defaultAction: 'SCMP_ACT_MAYBE' },
      { defaultAction: 'SCMP_ACT_NOTIFY' },
      { defaultAction: 'SCMP_ACT_ALLOW', syscalls: [{ action: 'SCMP_ACT_ERRNO' }] },
      {
        defaultAction: 'SCMP_ACT_ALLOW',
        syscalls: [{ names: ['x'], action: 'SCMP_ACT_ERRNO', args: [{ index: 6, value: 0, op: 'SCMP_CMP_EQ' }] }],
      },
      [],
    ];
    for (const doc of bad) {
      const err = thrown(() => parse(doc));
      expect(err.reason, JSON.stringify(doc)).toBe('OCI_SECCOMP_PROFILE_INVALID');
      expect(err.message.startsWith(field)).toBe(true);
    }
  });
});
