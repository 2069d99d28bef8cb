import { describe, expect, it } from 'vitest';
import type { NamespaceModeName, OciGuestLayout } from '../../../src/oci/input.js';
import { resolveNamespaces, resolveSysctls } from '../../../src/oci/namespaces.js';
import { thrown } from './load.js';

const guest: OciGuestLayout = {
  rootfsPath: '/r',
  cgroupsPath: '/c',
  mountSources: {},
  namespaces: { network: '/proc/1/ns/net', ipc: '/proc/9/ns/ipc', uts: '/proc/9/ns/uts', pid: '/proc/9/ns/pid' },
  shmPath: '/shm',
  etcDir: '/etc-dir',
};

const withPid = (pid: NamespaceModeName, target_id = '') => ({ linux: { security_context: { namespace_options: { pid, target_id } } } });

describe('namespaces', () => {
  it("CONTAINER pid: a new PID namespace; IPC, UTS and network are the pod's; mount and cgroup new", () => {
    expect(resolveNamespaces(withPid('CONTAINER'), {}, guest)).toEqual([
      { type: 'pid' },
      { type: 'ipc', path: '/proc/9/ns/ipc' },
      { type: 'uts', path: '/proc/9/ns/uts' },
      { type: 'mount' },
      { type: 'network', path: '/proc/1/ns/net' },
      { type: 'cgroup' },
    ]);
  });
  it("no namespace options at all mean POD, the CRI enum's zero value", () => {
    expect(resolveNamespaces({}, {}, guest)[0]).toEqual({ type: 'pid', path: '/proc/9/ns/pid' });
  });
  it("POD pid joins the pod's PID namespace", () => {
    expect(resolveNamespaces(withPid('POD'), {}, guest)[0]).toEqual({ type: 'pid', path: '/proc/9/ns/pid' });
  });
  it("NODE pid stays in the guest's root PID namespace (no pid entry)", () => {
    expect(resolveNamespaces(withPid('NODE'), {}, guest).some((n) => n.type === 'pid')).toBe(false);
  });
  it("TARGET pid joins the target's namespace, which must be given", () => {
    expect(resolveNamespaces(withPid('TARGET', 'abc'), {}, { ...guest, targetPidNamespace: '/proc/77/ns/pid' })[0]).toEqual({
      type: 'pid',
      path: '/proc/77/ns/pid',
    });
    const err = thrown(() => resolveNamespaces(withPid('TARGET', 'abc'), {}, guest));
    expect(err.reason).toBe('OCI_TARGET_NAMESPACE_UNKNOWN');
    expect(err.message).toMatch(/^container\.linux\.security_context\.namespace_options\.target_id /);
  });
  it('host network and host IPC are refused naming the field, in the sandbox or the container', () => {
    const net = thrown(() => resolveNamespaces({}, { linux: { security_context: { namespace_options: { network: 'NODE' } } } }, guest));
    expect(net.reason).toBe('OCI_HOST_NETWORK_UNSUPPORTED');
    expect(net.kind).toBe('invalid');
    expect(net.message).toMatch(/^sandbox\.linux\.security_context\.namespace_options\.network /);
    const ipc = thrown(() => resolveNamespaces({ linux: { security_context: { namespace_options: { ipc: 'NODE' } } } }, {}, guest));
    expect(ipc.reason).toBe('OCI_HOST_IPC_UNSUPPORTED');
    expect(ipc.message).toMatch(/^container\.linux\.security_context\.namespace_options\.ipc /);
  });
  it('a user namespace other than NODE is refused', () => {
    const opts = { linux: { security_context: { namespace_options: { userns_options: { mode: 'POD' as const } } } } };
    expect(thrown(() => resolveNamespaces(opts, {}, guest)).reason).toBe('OCI_USER_NAMESPACE_UNSUPPORTED');
  });
});

describe('sysctls', () => {
  const sysctls = (s: Record<string, string>) => resolveSysctls({ linux: { sysctls: s } });
  it('accepts the namespaced ones, in key order', () => {
    const ok = {
      'net.ipv4.ip_forward': '1',
      'kernel.shm_rmid_forced': '1',
      'kernel.shmmax': '1',
      'kernel.msgmnb': '1',
      'kernel.sem': '1 2 3 4',
      'fs.mqueue.queues_max': '1',
      'net/core/somaxconn': '1024',
    };
    expect(Object.keys(sysctls(ok) ?? {})).toEqual(Object.keys(ok).sort());
  });
  it('none: no sysctl object', () => {
    expect(sysctls({})).toBeUndefined();
    expect(resolveSysctls({})).toBeUndefined();
  });
  it('refuses node-wide ones naming the key', () => {
    for (const key of [
      'kernel.panic',
      'vm.swappiness',
      'kernel.semaphore',
      'kernel.msg_next_id',
      'fs.file-max',
      'kernel.hostname',
      'kernel/panic',
    ]) {
      const err = thrown(() => sysctls({ 'net.ipv4.ip_forward': '1', [key]: '1' }));
      expect(err.reason).toBe('OCI_SYSCTL_NOT_NAMESPACED');
      expect(err.kind).toBe('invalid');
      expect(err.message).toContain(`sandbox.linux.sysctls["${key}"]`);
    }
  });
});
