/**
 * What the decoders promise, checked on every fixture, captured ones included: the guest's spec,
 * built again from the decoded ContainerSpec by the core's buildOciSpec, runs exactly the process
 * containerd (or CRI-O) described: the same argv, environment, working directory, identity,
 * capabilities, limits, namespaces and volumes; and the decoded pod says what the pause
 * container's config.json says.
 */
import { describe, expect, it } from 'vitest';
import { buildOciSpec, type OciGuestLayout } from '../../../../src/oci/index.js';
import type { ContainerSpec } from '../../../../src/runtime/spec/container.js';
import {
  type DecodedPod,
  decodeBundleRole,
  decodePodSpec,
  decodeTaskContainerSpec,
  isSandboxFile,
  type OciRuntimeSpec,
  parseOciRuntimeSpec,
} from '../../../../src/shim/decode/index.js';
import { configFixtures, loadConfig } from './fixtures.js';

const fixtures = configFixtures().map((f) => ({ ...f, oci: parseOciRuntimeSpec(loadConfig(f.name)) }));
const roles = new Map(fixtures.map((f) => [f.name, decodeBundleRole(f.oci)]));
const sandboxes = fixtures.filter((f) => roles.get(f.name)?.role === 'sandbox');
const containers = fixtures.filter((f) => roles.get(f.name)?.role === 'container');

/** The decoded pod of a container's sandbox (a fixture of the same pod, else a minimal one). */
function podOf(oci: OciRuntimeSpec, sandboxId: string, privileged: boolean): DecodedPod['spec'] {
  const fixture = sandboxes.find((s) => roles.get(s.name)?.sandboxId === sandboxId);
  if (fixture !== undefined) return decodePodSpec(fixture.oci, { privileged }).spec;
  const annotations = { ...(oci.annotations ?? {}), 'io.kubernetes.cri.container-type': 'sandbox' };
  return decodePodSpec(
    { ociVersion: '1.0.2', annotations, linux: { namespaces: [{ type: 'network' }, { type: 'ipc' }, { type: 'pid' }] } },
    { privileged },
  ).spec;
}

function guestLayout(spec: ContainerSpec): OciGuestLayout {
  return {
    rootfsPath: '/run/kata-ts/shared/containers/c/rootfs',
    cgroupsPath: '/kata-ts/c',
    mountSources: Object.fromEntries(spec.mounts.map((m, i) => [m.container_path, `/run/kata-ts/shared/containers/c/mounts/${i}`])),
    devices: Object.fromEntries(spec.devices.map((d, i) => [d.container_path, { type: 'c' as const, major: 240, minor: i }])),
    namespaces: { network: '/proc/1/ns/net', ipc: '/proc/1/ns/ipc', uts: '/proc/1/ns/uts', pid: '/proc/1/ns/pid' },
    shmPath: '/run/kata-ts/shm',
    etcDir: '/run/kata-ts/etc',
  };
}

const defined = <T extends object>(o: T | undefined): Partial<T> =>
  Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined && v !== 0 && v !== '')) as Partial<T>;

describe('decoded containers run what their config.json says (buildOciSpec round trip)', () => {
  it('has container fixtures', () => {
    expect(containers.length).toBeGreaterThanOrEqual(4);
  });

  it.each(containers.map((f) => [f.name, f] as const))('%s', (_name, fixture) => {
    const { oci } = fixture;
    const role = roles.get(fixture.name)!;
    const decoded = decodeTaskContainerSpec(oci, role.sandboxId);
    const privileged = decoded.linux?.security_context?.privileged === true;
    const guest = buildOciSpec({
      container: decoded,
      sandbox: podOf(oci, role.sandboxId, privileged),
      image: null,
      guest: guestLayout(decoded),
    }).spec;
    const want = oci.process!;
    const got = guest.process!;

    expect(got.args).toEqual(want.args);
    expect(got.cwd).toBe(want.cwd);
    expect(got.terminal).toBe(want.terminal === true);
    // The config.json's environment, value for value (the guest may add HOME or TERM, never change one).
    const gotEnv = new Map(got.env?.map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
    for (const e of want.env ?? []) expect(gotEnv.get(e.slice(0, e.indexOf('=')))).toBe(e.slice(e.indexOf('=') + 1));
    expect([got.user.uid, got.user.gid]).toEqual([want.user.uid, want.user.gid]);
    // Every group of the config.json, and nothing else but the primary group (which the guest lists too).
    const wantGids = new Set(want.user.additionalGids ?? []);
    for (const g of wantGids) expect(got.user.additionalGids).toContain(g);
    for (const g of got.user.additionalGids ?? []) expect(wantGids.has(g) || g === want.user.gid).toBe(true);
    expect(got.noNewPrivileges).toBe(want.noNewPrivileges === true);
    // An adjustment of 0 is the default whether written or not.
    expect(got.oomScoreAdj ?? 0).toBe(want.oomScoreAdj ?? 0);
    if (!privileged) {
      expect(new Set(got.capabilities?.bounding)).toEqual(new Set(want.capabilities?.bounding ?? []));
      expect(got.capabilities?.ambient ?? []).toEqual(want.capabilities?.ambient ?? []);
      expect(guest.linux?.seccomp !== undefined).toBe(oci.linux?.seccomp !== undefined);
      expect(guest.linux?.maskedPaths ?? []).toEqual(oci.linux?.maskedPaths ?? []);
      expect(guest.linux?.readonlyPaths ?? []).toEqual(oci.linux?.readonlyPaths ?? []);
    } else {
      expect(guest.linux?.seccomp).toBeUndefined();
      expect(guest.linux?.resources?.devices).toEqual([{ allow: true, access: 'rwm' }]);
    }
    expect(guest.root.readonly === true).toBe(oci.root?.readonly === true);

    const wantResources = oci.linux?.resources;
    expect(defined(guest.linux?.resources?.cpu)).toEqual(defined(wantResources?.cpu));
    expect(defined(guest.linux?.resources?.memory)).toEqual(defined(wantResources?.memory));
    expect(guest.linux?.resources?.hugepageLimits ?? []).toEqual(wantResources?.hugepageLimits ?? []);
    expect(guest.linux?.resources?.unified ?? {}).toEqual(wantResources?.unified ?? {});

    // PID namespace: joined when the config.json joins one, new when it asks for a new one.
    const pid = (list: typeof guest.linux) => list?.namespaces?.find((n) => n.type === 'pid');
    const wantPid = oci.linux?.namespaces?.find((n) => n.type === 'pid');
    expect(pid(guest.linux) === undefined).toBe(wantPid === undefined);
    if (wantPid !== undefined) expect(pid(guest.linux)?.path === undefined).toBe(wantPid.path === undefined || wantPid.path === '');

    // Every volume (a bind mount that is not one of the sandbox's own files), read-only as asked.
    const volumes = (oci.mounts ?? []).filter(
      (m) =>
        (m.type === 'bind' || m.options?.includes('bind') || m.options?.includes('rbind')) &&
        !isSandboxFile(m.destination, m.source ?? '', role.sandboxId),
    );
    for (const v of volumes) {
      const mounted = guest.mounts?.find((m) => m.destination === v.destination && m.type === 'bind');
      expect(mounted, v.destination).toBeDefined();
      expect(mounted?.options?.includes('ro'), v.destination).toBe(
        v.options?.includes('ro') === true || v.options?.includes('rro') === true,
      );
    }
    // The sandbox's own files come from the guest's, never from the host's sandbox directory.
    for (const m of guest.mounts ?? []) expect(m.source ?? '').not.toContain(role.sandboxId);
  });
});

describe('decoded pods say what their config.json says', () => {
  it.each(sandboxes.map((f) => [f.name, f] as const))('%s', (_name, fixture) => {
    const { oci } = fixture;
    const pod = decodePodSpec(oci);
    const a = oci.annotations ?? {};
    if (pod.kind === 'containerd') {
      expect(pod.spec.metadata).toMatchObject({
        name: a['io.kubernetes.cri.sandbox-name'],
        namespace: a['io.kubernetes.cri.sandbox-namespace'],
        uid: a['io.kubernetes.cri.sandbox-uid'],
      });
      expect(pod.spec.log_directory).toBe(a['io.kubernetes.cri.sandbox-log-directory'] ?? '');
      if (a['io.kubernetes.cri.sandbox-memory'] !== undefined)
        expect(pod.spec.linux?.resources?.memory_limit_in_bytes).toBe(String(BigInt(a['io.kubernetes.cri.sandbox-memory'])));
    }
    expect(pod.spec.hostname).toBe(oci.hostname ?? '');
    expect(pod.spec.annotations).toEqual(a);
    expect(pod.netnsPath).toBe(oci.linux?.namespaces?.find((n) => n.type === 'network')?.path ?? null);
    expect(pod.cgroup?.cgroupsPath ?? '').toBe(oci.linux?.cgroupsPath ?? '');
    expect(pod.spec.linux?.sysctls).toEqual(oci.linux?.sysctl ?? {});
  });
});
