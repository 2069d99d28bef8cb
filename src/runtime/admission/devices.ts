import type { CdiDeviceInput, DeviceInput } from '../../sizing/input.js';
import { ABSENT, type Difference, keyed, quoted } from './types.js';

const CANONICAL_ORDER = 'rwm';

/**
 * Device cgroup permissions as a set of letters (r read, w write, m mknod), shown in `rwm`
 * order: `rw` and `wr` grant the same, a repeated letter grants nothing more. Letters outside
 * `rwm` are kept (sorted after them) so that they still show up as a difference.
 */
export function permissionSet(permissions: string | undefined | null): string {
  const letters = [...new Set(permissions ?? '')];
  const rank = (c: string): number => {
    const i = CANONICAL_ORDER.indexOf(c);
    return i < 0 ? CANONICAL_ORDER.length : i;
  };
  const sorted = letters.sort((x, y) => rank(x) - rank(y) || (x < y ? -1 : x > y ? 1 : 0)).join('');
  return sorted === '' ? '""' : sorted;
}

interface DeviceView {
  host_path: string;
  permissions: string;
}

function view(d: DeviceInput): DeviceView {
  return { host_path: quoted(d.host_path), permissions: permissionSet(d.permissions) };
}

function byPath(devices: readonly DeviceInput[] | undefined): Map<string, DeviceInput[]> {
  const out = new Map<string, DeviceInput[]>();
  for (const d of devices ?? []) {
    const key = d.container_path ?? '';
    out.set(key, [...(out.get(key) ?? []), d]);
  }
  return out;
}

function side(list: DeviceInput[] | undefined): string {
  if (list === undefined || list.length === 0) return ABSENT;
  if (list.length > 1) return `${list.length} devices at this path`;
  const v = view(list[0]!);
  return `host_path ${v.host_path}, permissions ${v.permissions}`;
}

function sameList(a: DeviceInput[] | undefined, b: DeviceInput[] | undefined): boolean {
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  return a.every((d, i) => JSON.stringify(view(d)) === JSON.stringify(view(b[i]!)));
}

/**
 * Compare devices keyed by container path: host path and permissions (as letter sets) of a device
 * on both sides, or the device as a whole when one side lacks it. Devices are created in the
 * container's /dev independently of each other, so their order is not compared.
 */
export function compareDevices(announced: readonly DeviceInput[] | undefined, received: readonly DeviceInput[] | undefined): Difference[] {
  const a = byPath(announced);
  const r = byPath(received);
  const out: Difference[] = [];
  for (const path of [...new Set([...a.keys(), ...r.keys()])].sort()) {
    const la = a.get(path);
    const lr = r.get(path);
    const prefix = keyed('devices', path);
    if (la === undefined || lr === undefined || la.length !== 1 || lr.length !== 1) {
      if (!sameList(la, lr)) out.push({ field: prefix, announced: side(la), received: side(lr) });
      continue;
    }
    const va = view(la[0]!);
    const vr = view(lr[0]!);
    if (va.host_path !== vr.host_path) out.push({ field: `${prefix}.host_path`, announced: va.host_path, received: vr.host_path });
    if (va.permissions !== vr.permissions)
      out.push({ field: `${prefix}.permissions`, announced: va.permissions, received: vr.permissions });
  }
  return out;
}

/**
 * Compare CDI devices as a set of fully qualified names (`vendor/class=name`): order and
 * repetition do not matter (a CDI device is injected once however often it is named).
 */
export function compareCdiDevices(
  announced: readonly CdiDeviceInput[] | undefined,
  received: readonly CdiDeviceInput[] | undefined,
): Difference[] {
  const a = new Set((announced ?? []).map((d) => d.name ?? ''));
  const r = new Set((received ?? []).map((d) => d.name ?? ''));
  const out: Difference[] = [];
  for (const name of [...new Set([...a, ...r])].sort()) {
    if (a.has(name) && r.has(name)) continue;
    out.push({
      field: keyed('CDI_devices', name),
      announced: a.has(name) ? 'present' : ABSENT,
      received: r.has(name) ? 'present' : ABSENT,
    });
  }
  return out;
}
