import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isKataError } from '../../../src/common/errors.js';
import { readBundleConfig, taskRole } from '../../../src/shim/bundle.js';
import {
  locatePod,
  MAX_SOCKET_PATH_BYTES,
  podStateDir,
  readShimInfo,
  type ShimInfo,
  shimSocketPath,
  socketAddress,
  socketPathOf,
  writeShimInfo,
} from '../../../src/shim/paths.js';
import { cgroupDriverForPath, cgroupParentForDriver, podCgroupDriver } from '../../../src/shim/pod.js';

const ID = 'f0e1d2c3b4a5968778695a4b3c2d1e0ff0e1d2c3b4a5968778695a4b3c2d1e0f';
const dirs: string[] = [];
function tmp(): string {
  const d = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-paths-'));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function reason(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isKataError(err) ? `${err.kind}:${err.reason}` : String(err);
  }
  return undefined;
}

describe('shim paths', () => {
  it('names the socket by the sha256 of address/namespace/id, as containerd names its shims', () => {
    const socket = shimSocketPath('/run/kata-ts/shim', '/run/containerd/containerd.sock', 'k8s.io', ID);
    const digest = createHash('sha256').update(`/run/containerd/containerd.sock/k8s.io/${ID}`).digest('hex');
    expect(socket).toBe(`/run/kata-ts/shim/s/${digest}`);
    expect(Buffer.byteLength(socket)).toBeLessThan(107);
    expect(socketAddress(socket)).toBe(`unix://${socket}`);
    expect(socketPathOf(socketAddress(socket))).toBe(socket);
    // CRI-O passes "none" as the address: still one socket per pod.
    expect(shimSocketPath('/r', 'none', 'default', 'a')).not.toBe(shimSocketPath('/r', 'none', 'default', 'b'));
  });

  it('refuses a state root whose socket would not fit in sun_path', () => {
    const longRoot = `/${'x'.repeat(MAX_SOCKET_PATH_BYTES - 67)}`;
    expect(reason(() => shimSocketPath(longRoot, 'a', 'ns', 'id'))).toBe('invalid:SHIM_SOCKET_PATH_TOO_LONG');
    expect(reason(() => shimSocketPath(longRoot.slice(0, -1), 'a', 'ns', 'id'))).toBeUndefined();
  });

  it("puts a pod's state under <namespace>/<id:16> and checks the VM's sockets fit", () => {
    expect(podStateDir('/run/kata-ts/shim', 'k8s.io', ID)).toBe(`/run/kata-ts/shim/k8s.io/${ID.slice(0, 16)}`);
    expect(reason(() => podStateDir(`/${'y'.repeat(60)}`, 'k8s.io', ID))).toBe('invalid:SHIM_SOCKET_PATH_TOO_LONG');
  });

  it('refuses namespaces and ids that are not containerd identifiers (they name directories)', () => {
    expect(reason(() => podStateDir('/r', '../etc', ID))).toBe('invalid:SHIM_NAMESPACE_INVALID');
    expect(reason(() => podStateDir('/r', 'k8s.io', 'a/b'))).toBe('invalid:SHIM_ID_INVALID');
    expect(reason(() => podStateDir('/r', 'k8s.io', ''))).toBe('invalid:SHIM_ID_INVALID');
    expect(reason(() => podStateDir('/r', 'a'.repeat(77), ID))).toBe('invalid:SHIM_NAMESPACE_INVALID');
  });

  it('writes and reads shim.json, and finds a pod by its sandbox or by a container record', async () => {
    const root = tmp();
    const stateDir = podStateDir(root, 'k8s.io', ID);
    mkdirSync(path.join(stateDir, 'containers'), { recursive: true });
    const info: ShimInfo = {
      pid: 42,
      sandboxId: ID,
      namespace: 'k8s.io',
      bundle: '/b',
      socket: '/s',
      cgroupDriver: 'cgroupfs',
      startedAt: '2026-01-01T00:00:00.000Z',
    };
    await writeShimInfo(stateDir, info);
    expect(await readShimInfo(stateDir)).toEqual(info);
    writeFileSync(path.join(stateDir, 'containers', 'ctr1.json'), '{}');
    expect(await locatePod(root, 'k8s.io', ID)).toEqual({ sandboxId: ID, stateDir });
    expect(await locatePod(root, 'k8s.io', 'ctr1')).toEqual({ sandboxId: ID, stateDir });
    expect(await locatePod(root, 'k8s.io', 'other')).toBeUndefined();
    expect(await locatePod(root, 'default', 'ctr1')).toBeUndefined();
    writeFileSync(path.join(stateDir, 'shim.json'), '{"pid":"x"}');
    await expect(readShimInfo(stateDir)).rejects.toMatchObject({ reason: 'SHIM_INFO_INVALID' });
  });
});

describe('bundle', () => {
  it("tells a pod's sandbox from its containers by containerd's or CRI-O's annotations", () => {
    expect(taskRole('s1', { 'io.kubernetes.cri.container-type': 'sandbox', 'io.kubernetes.cri.sandbox-id': 's1' })).toEqual({
      role: 'sandbox',
      sandboxId: 's1',
    });
    expect(taskRole('c1', { 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': 's1' })).toEqual({
      role: 'container',
      sandboxId: 's1',
    });
    expect(taskRole('s2', { 'io.kubernetes.cri-o.ContainerType': 'sandbox', 'io.kubernetes.cri-o.SandboxID': 's2' }).role).toBe('sandbox');
    expect(taskRole('c2', { 'io.kubernetes.cri-o.ContainerType': 'container', 'io.kubernetes.cri-o.SandboxID': 's2' })).toEqual({
      role: 'container',
      sandboxId: 's2',
    });
    // No annotations: a standalone task is a pod of its own.
    expect(taskRole('t', {})).toEqual({ role: 'sandbox', sandboxId: 't' });
    expect(() => taskRole('c3', { 'io.kubernetes.cri.container-type': 'container' })).toThrow(
      /io\.kubernetes\.cri\.sandbox-id names no sandbox/,
    );
  });

  it('reads annotations and linux.cgroupsPath from config.json; a missing file is INVALID_ARGUMENT', async () => {
    const dir = tmp();
    writeFileSync(
      path.join(dir, 'config.json'),
      JSON.stringify({ annotations: { a: 'b', n: 1 }, linux: { cgroupsPath: 'kubepods.slice:cri-containerd:x' } }),
    );
    expect(await readBundleConfig(dir)).toEqual({ annotations: { a: 'b' }, cgroupsPath: 'kubepods.slice:cri-containerd:x' });
    await expect(readBundleConfig(path.join(dir, 'nope'))).rejects.toMatchObject({ kind: 'invalid', reason: 'SHIM_BUNDLE_INVALID' });
  });

  it('chooses the cgroup driver from the cgroupsPath form', () => {
    expect(cgroupDriverForPath('kubepods-besteffort-pod1.slice:cri-containerd:abc')).toBe('systemd');
    expect(cgroupDriverForPath('/kubepods/besteffort/pod1/abc')).toBe('cgroupfs');
    expect(cgroupDriverForPath('kubepods/abc')).toBe('cgroupfs');
    expect(cgroupDriverForPath('')).toBeNull();
    expect(cgroupDriverForPath(null)).toBeNull();
  });

  it("lets the config's named cgroup driver win over the path's form; 'auto' follows what the host runs, then the path", () => {
    const slice = 'test.slice:cri-containerd:abc';
    expect(podCgroupDriver('cgroupfs', slice, 'systemd')).toBe('cgroupfs');
    expect(podCgroupDriver('systemd', '/kubepods/pod1/abc', 'cgroupfs')).toBe('systemd');
    expect(podCgroupDriver('auto', slice, 'systemd')).toBe('systemd');
    // critest through containerd 1.6 on a host without systemd: a slice path, and no D-Bus to place it with.
    expect(podCgroupDriver('auto', slice, 'cgroupfs')).toBe('cgroupfs');
    expect(podCgroupDriver('auto', '/kubepods/pod1/abc', 'systemd')).toBe('cgroupfs');
    expect(podCgroupDriver('auto', '/kubepods/pod1/abc', 'cgroupfs')).toBe('cgroupfs');
    expect(podCgroupDriver('auto', '', 'systemd')).toBe('systemd');
    expect(podCgroupDriver('auto', '', 'cgroupfs')).toBe('cgroupfs');
  });

  it('drops a systemd slice as cgroup_parent under the cgroupfs driver, and only then', () => {
    expect(cgroupParentForDriver('cgroupfs', 'systemd', 'test.slice')).toBe('');
    expect(cgroupParentForDriver('cgroupfs', 'cgroupfs', '/kubepods/pod1')).toBe('/kubepods/pod1');
    expect(cgroupParentForDriver('systemd', 'systemd', 'kubepods.slice')).toBe('kubepods.slice');
    expect(cgroupParentForDriver('systemd', 'cgroupfs', '/kubepods/pod1')).toBe('/kubepods/pod1');
    expect(cgroupParentForDriver('cgroupfs', null, '')).toBe('');
  });
});
