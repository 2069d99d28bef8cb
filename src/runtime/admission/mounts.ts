import type { MountInput } from '../../sizing/input.js';
import { ABSENT, type Difference, keyed, quoted } from './types.js';

const PROPAGATION_BY_NUMBER = ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER', 'PROPAGATION_BIDIRECTIONAL'];

/** The CRI MountPropagation name; unset (proto3 default 0) is PROPAGATION_PRIVATE. */
export function propagationName(value: string | number | undefined | null): string {
  if (value === undefined || value === null || value === '' || value === 0) return 'PROPAGATION_PRIVATE';
  if (typeof value === 'number') return PROPAGATION_BY_NUMBER[value] ?? String(value);
  return value;
}

/** The fields of a mount that admission compares, normalised to their display values. */
interface MountView {
  host_path: string;
  image: string;
  image_sub_path: string;
  readonly: string;
  recursive_read_only: string;
  propagation: string;
}

/*
 * Compared: everything that decides WHAT reaches the container and with which access, because
 * that is what the sandbox prepared when it shared sources into the VM:
 * - the source: host_path, or image (ImageSpec.image) plus image_sub_path for image volumes
 *   (the sub-path picks which part of the image is exposed, so it is part of the source);
 * - access: readonly, and recursive_read_only (a read-only share must not turn writable below a
 *   submount; it is the same promise as readonly, extended to nested mounts);
 * - propagation: whether host mounts flow into the share (HOST_TO_CONTAINER) or out of it
 *   (BIDIRECTIONAL) changes how the share is set up between host and guest.
 * Not compared: selinux_relabel (a label the runtime applies to the host source, not a property
 * of what the guest sees or of the VM's shape) and uidMappings/gidMappings (applied inside the
 * guest when the container is created, from the pod's user namespace, not when sharing).
 */
function view(m: MountInput): MountView {
  return {
    host_path: quoted(m.host_path),
    image: quoted(m.image?.image),
    image_sub_path: quoted(m.image_sub_path),
    readonly: String(m.readonly === true),
    recursive_read_only: String(m.recursive_read_only === true),
    propagation: propagationName(m.propagation),
  };
}

/** A short description of a mount present on one side only. */
function summary(m: MountInput): string {
  const v = view(m);
  const image = m.image?.image ?? '';
  const parts = [image !== '' ? `image ${v.image}` : `host_path ${v.host_path}`];
  if (m.readonly === true) parts.push('readonly');
  if (v.propagation !== 'PROPAGATION_PRIVATE') parts.push(v.propagation);
  return parts.join(', ');
}

function byPath(mounts: readonly MountInput[] | undefined): Map<string, MountInput[]> {
  const out = new Map<string, MountInput[]>();
  for (const m of mounts ?? []) {
    const key = m.container_path ?? '';
    const list = out.get(key);
    if (list === undefined) out.set(key, [m]);
    else list.push(m);
  }
  return out;
}

function side(list: MountInput[] | undefined): string {
  if (list === undefined || list.length === 0) return ABSENT;
  if (list.length === 1) return summary(list[0]!);
  return `${list.length} mounts at this path`;
}

function sameRepetition(a: MountInput[] | undefined, b: MountInput[] | undefined): boolean {
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  return a.every((m, i) => JSON.stringify(view(m)) === JSON.stringify(view(b[i]!)));
}

/** Path segments without empty and `.` parts, so `/a//b/` nests like `/a/b`. */
function segments(path: string): string[] {
  return path.split('/').filter((s) => s !== '' && s !== '.');
}

/**
 * The OCI runtime spec applies mounts in order, so the order matters exactly where one mount's
 * container path lies under another's: mounting `/data` after `/data/cache` hides the latter.
 * The relative order of unrelated mounts changes nothing and is not compared. Returns one
 * `mounts order` difference listing the nested paths whose relative order changed, each side
 * in its own order.
 */
function compareNestedOrder(announced: readonly MountInput[], received: readonly MountInput[], common: ReadonlySet<string>): Difference[] {
  const firstIndex = (list: readonly MountInput[]): Map<string, number> => {
    const out = new Map<string, number>();
    list.forEach((m, i) => {
      const key = m.container_path ?? '';
      if (common.has(key) && !out.has(key)) out.set(key, i);
    });
    return out;
  };
  const ai = firstIndex(announced);
  const ri = firstIndex(received);
  // Normalised path -> literal container paths, to find ancestors by walking up (O(n * depth)).
  const byNormal = new Map<string, string[]>();
  for (const p of common) {
    const key = `/${segments(p).join('/')}`;
    byNormal.set(key, [...(byNormal.get(key) ?? []), p]);
  }
  const involved = new Set<string>();
  for (const p of common) {
    const segs = segments(p);
    for (let depth = 0; depth < segs.length; depth++) {
      for (const ancestor of byNormal.get(`/${segs.slice(0, depth).join('/')}`) ?? []) {
        const announcedFirst = ai.get(ancestor)! < ai.get(p)!;
        const receivedFirst = ri.get(ancestor)! < ri.get(p)!;
        if (announcedFirst !== receivedFirst) {
          involved.add(ancestor);
          involved.add(p);
        }
      }
    }
  }
  if (involved.size === 0) return [];
  const ordered = (index: Map<string, number>): string =>
    [...involved]
      .sort((x, y) => index.get(x)! - index.get(y)!)
      .map((p) => quoted(p))
      .join(', ');
  return [{ field: 'mounts order', announced: ordered(ai), received: ordered(ri) }];
}

/**
 * Compare mounts keyed by container path (unique within a container): each field of a mount on
 * both sides, a mount on one side only (`absent` on the other), and the order of nested mounts.
 */
export function compareMounts(announced: readonly MountInput[] | undefined, received: readonly MountInput[] | undefined): Difference[] {
  const a = byPath(announced);
  const r = byPath(received);
  const out: Difference[] = [];
  const common = new Set<string>();
  for (const path of [...new Set([...a.keys(), ...r.keys()])].sort()) {
    const la = a.get(path);
    const lr = r.get(path);
    const prefix = keyed('mounts', path);
    if (la === undefined || lr === undefined || la.length !== 1 || lr.length !== 1) {
      // One side only, or a path repeated (malformed; the same repetition on both sides is
      // still equal): the entry as a whole differs.
      if (!sameRepetition(la, lr)) out.push({ field: prefix, announced: side(la), received: side(lr) });
      continue;
    }
    common.add(path);
    const va = view(la[0]!);
    const vr = view(lr[0]!);
    for (const key of Object.keys(va) as (keyof MountView)[]) {
      if (va[key] !== vr[key]) out.push({ field: `${prefix}.${key}`, announced: va[key], received: vr[key] });
    }
  }
  return [...out, ...compareNestedOrder(announced ?? [], received ?? [], common)];
}
