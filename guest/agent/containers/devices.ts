/**
 * The host's devices (CreateContainerRequest.devices, planned by
 * src/runtime/container/guest-devices.ts) resolved to the guest's own device nodes: a hot-plugged
 * VFIO group becomes the guest's `/dev/vfio/<group>` (the group the guest kernel gave the function
 * found at the PCI path), a guest node keeps its path. Majors and minors are the guest kernel's.
 */

import { readdir, readlink, stat } from 'node:fs/promises';
import path from 'node:path';
import { errnoCode, invalid, precondition } from '../../../src/common/errors.js';
import type { GuestDevice } from '../../../src/generated/agent/agent.js';
import type { OciSpec } from './types.js';

/** A device node found in the guest, ready for linux.devices. */
export interface ResolvedDevice {
  containerPath: string;
  access: string;
  type: 'c' | 'b';
  major: number;
  minor: number;
  fileMode: number;
  uid: number;
  gid: number;
}

export interface GuestRoots {
  /** `/sys` in the guest; a fixture tree in tests. */
  sysRoot: string;
  /** `/dev` in the guest; a fixture tree in tests. */
  devRoot: string;
}

export const GUEST_ROOTS: GuestRoots = { sysRoot: '/sys', devRoot: '/dev' };

/** Linux's dev_t split (glibc's gnu_dev_major/minor), on node's numeric rdev. */
export function splitDev(rdev: number): { major: number; minor: number } {
  const hi = Math.floor(rdev / 2 ** 32);
  const lo = rdev >>> 0;
  return { major: ((lo >>> 8) & 0xfff) | ((hi & 0xfffff000) >>> 0), minor: (lo & 0xff) | ((lo >>> 12) & 0xfff00) };
}

/** The guest sysfs directory of the function at a PCI path (`01.0/00.0`): hop by hop from the root bus. */
async function pciDevice(sysRoot: string, pciPath: string): Promise<string | undefined> {
  let dir = path.join(sysRoot, 'devices', 'pci0000:00');
  let bus = '0000:00';
  for (const hop of pciPath.split('/')) {
    const name = `${bus}:${hop}`;
    const next = path.join(dir, name);
    try {
      await stat(next);
    } catch {
      return undefined;
    }
    dir = next;
    // The bus behind a bridge: the child directory named <domain>:<bus>:<dev>.<fn>.
    const child = (await readdir(dir).catch(() => [] as string[])).find((n) => /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/.test(n));
    bus = child === undefined ? bus : child.slice(0, 7);
  }
  return dir;
}

async function nodeFacts(devPath: string): Promise<Omit<ResolvedDevice, 'containerPath' | 'access'> | undefined> {
  try {
    const st = await stat(devPath);
    const type = st.isCharacterDevice() ? 'c' : st.isBlockDevice() ? 'b' : undefined;
    if (type === undefined) return undefined;
    return { type, ...splitDev(st.rdev), fileMode: st.mode & 0o7777, uid: st.uid, gid: st.gid };
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

/** The guest paths where the node of one device may be, most likely first. */
async function candidateNodes(d: GuestDevice, roots: GuestRoots): Promise<string[]> {
  switch (d.kind) {
    case 'GUEST_DEVICE_KIND_VFIO_CONTAINER':
      return [path.join(roots.devRoot, 'vfio', 'vfio')];
    case 'GUEST_DEVICE_KIND_GUEST_NODE':
      return [path.join(roots.devRoot, path.posix.relative('/dev', d.guestPath))];
    case 'GUEST_DEVICE_KIND_VFIO_GROUP':
      // Every function of one host group lands in one guest group; the first one found names it.
      for (const p of d.pciPaths) {
        const dir = await pciDevice(roots.sysRoot, p);
        const link = dir === undefined ? undefined : await readlink(path.join(dir, 'iommu_group')).catch(() => undefined);
        if (link === undefined) continue;
        const group = path.basename(link);
        return [path.join(roots.devRoot, 'vfio', group), path.join(roots.devRoot, 'vfio', `noiommu-${group}`)];
      }
      return [];
    default:
      // A host newer than this agent, or a sender that left the kind out.
      throw invalid('DEVICE_KIND_UNKNOWN', `The device for ${d.containerPath} has no kind this agent knows.`, {
        details: { containerPath: d.containerPath, kind: d.kind },
      });
  }
}

/** Finds the guest node of every device; a missing one is FAILED_PRECONDITION naming it. */
export async function resolveGuestDevices(devices: readonly GuestDevice[], roots: GuestRoots): Promise<ResolvedDevice[]> {
  const out: ResolvedDevice[] = [];
  for (const r of devices) {
    const nodes = await candidateNodes(r, roots);
    let facts: Awaited<ReturnType<typeof nodeFacts>>;
    for (const n of nodes) {
      facts = await nodeFacts(n);
      if (facts !== undefined) break;
    }
    if (facts === undefined)
      throw precondition('DEVICE_NOT_IN_GUEST', `The device for ${r.containerPath} has no node in the guest.`, {
        details: { containerPath: r.containerPath, kind: r.kind, pciPaths: r.pciPaths, guestPath: r.guestPath },
      });
    out.push({ containerPath: r.containerPath, access: r.access, ...facts });
  }
  return out;
}

/** The spec with the resolved nodes in linux.devices and allowed by the device cgroup (pure). */
export function withGuestDevices(spec: OciSpec, devices: readonly ResolvedDevice[]): OciSpec {
  if (devices.length === 0) return spec;
  const linux = (spec.linux ?? {}) as Record<string, unknown> & {
    devices?: Array<Record<string, unknown>>;
    resources?: Record<string, unknown> & { devices?: Array<Record<string, unknown>> };
  };
  const paths = new Set(devices.map((d) => d.containerPath));
  const nodes = [
    ...(linux.devices ?? []).filter((d) => !paths.has(String(d.path))),
    ...devices.map((d) => ({
      path: d.containerPath,
      type: d.type,
      major: d.major,
      minor: d.minor,
      fileMode: d.fileMode,
      uid: d.uid,
      gid: d.gid,
    })),
  ];
  const rules = [
    ...(linux.resources?.devices ?? [{ allow: false, access: 'rwm' }]),
    ...devices.map((d) => ({ allow: true, type: d.type, major: d.major, minor: d.minor, access: d.access })),
  ];
  return { ...spec, linux: { ...linux, devices: nodes, resources: { ...linux.resources, devices: rules } } } as OciSpec;
}
