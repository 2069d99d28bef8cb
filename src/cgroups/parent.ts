/**
 * cgroup_parent as kubelets (and crictl) send it, parsed per driver (pure).
 *
 * - systemd driver: the pod's slice, either as the expanded path the kubelet sends
 *   (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`)
 *   or as a bare `x.slice`; "" lets the manager pick its default slice.
 * - cgroupfs driver: a path below each hierarchy's root (`/kubepods/burstable/pod<uid>`); "" means
 *   directly below the root.
 *
 * A parent of the other driver's style is refused with FAILED_PRECONDITION naming both, as CRI-O
 * does: placing the VMM anyway would put it outside the pod's budget.
 */
import { invalid, precondition } from '../common/errors.js';
import type { CgroupDriverName } from './types.js';

/** systemd's UNIT_NAME_MAX is 256 including the terminating NUL. */
const UNIT_NAME_MAX_CHARS = 255;
/** Characters systemd accepts in a plain unit name (unit_name_is_valid without templates). */
const UNIT_NAME_CHARS = /^[A-Za-z0-9:_.\\-]+$/;
const SLICE_SUFFIX = '.slice';
/** The root slice, whose cgroup is the manager's root. */
export const ROOT_SLICE = '-.slice';
/** A cgroupfs path component: printable, no '/', not a dot entry (checked separately). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what this refuses.
const CGROUPFS_COMPONENT = /^[^/\s\x00-\x1f\x7f]+$/;
const CGROUPFS_COMPONENT_MAX = 255;

export interface SystemdParent {
  style: 'systemd';
  /** The slice unit; null when the manager's default slice applies (empty cgroup_parent). */
  slice: string | null;
  /** The slice's cgroup path below the manager's root, `/a.slice/a-b.slice`; '' when slice is null or the root slice. */
  path: string;
}

export interface CgroupfsParent {
  style: 'cgroupfs';
  /** Normalised path below each hierarchy root with a leading '/', or '' for the root itself. */
  path: string;
  components: string[];
}

function basename(p: string): string {
  const parts = p.split('/').filter((c) => c !== '');
  return parts[parts.length - 1] ?? '';
}

/** True when the parent names a systemd slice (its last component ends in `.slice`). */
export function isSystemdStyleParent(cgroupParent: string): boolean {
  return basename(cgroupParent).endsWith(SLICE_SUFFIX);
}

/** Why `name` is not a valid slice unit name by systemd's rules, or null when it is valid. */
export function sliceNameProblem(name: string): string | null {
  if (name.length === 0) return 'it is empty';
  if (name.length > UNIT_NAME_MAX_CHARS) return `it is longer than ${UNIT_NAME_MAX_CHARS} characters`;
  if (!name.endsWith(SLICE_SUFFIX)) return `it does not end in "${SLICE_SUFFIX}"`;
  if (!UNIT_NAME_CHARS.test(name)) return 'it contains characters other than letters, digits and ":_.\\-"';
  if (name === ROOT_SLICE) return null;
  const prefix = name.slice(0, -SLICE_SUFFIX.length);
  if (prefix.length === 0) return 'its name before ".slice" is empty';
  // Slices nest by their dash-separated prefix, so an empty level ("--", or a dash at either
  // end) would name a parent slice that cannot exist.
  if (prefix.startsWith('-') || prefix.endsWith('-')) return 'it starts or ends with "-"';
  if (prefix.includes('--')) return 'it contains "--"';
  return null;
}

/**
 * The cgroup path of a slice below the manager's root: `a-b-c.slice` lives at
 * `/a.slice/a-b.slice/a-b-c.slice`; the root slice at ''. Throws INVALID_ARGUMENT for a name
 * systemd would refuse.
 */
export function expandSlice(slice: string): string {
  const problem = sliceNameProblem(slice);
  if (problem !== null) {
    throw invalid('CGROUP_PARENT_INVALID', `cgroup_parent slice "${slice}" is not a valid systemd slice name because ${problem}.`, {
      details: { cgroupParent: slice },
    });
  }
  if (slice === ROOT_SLICE) return '';
  const levels = slice.slice(0, -SLICE_SUFFIX.length).split('-');
  let prefix = '';
  let out = '';
  for (const level of levels) {
    prefix = prefix === '' ? level : `${prefix}-${level}`;
    out += `/${prefix}${SLICE_SUFFIX}`;
  }
  return out;
}

function styleMismatch(cgroupParent: string, driver: CgroupDriverName): never {
  const message =
    driver === 'systemd'
      ? `cgroup_parent "${cgroupParent}" is a cgroupfs path but the cgroup driver is systemd, which takes a slice such as "kubepods-burstable-pod<uid>.slice".`
      : `cgroup_parent "${cgroupParent}" is a systemd slice but the cgroup driver is cgroupfs, which takes a path such as "/kubepods/burstable/pod<uid>".`;
  throw precondition('CGROUP_PARENT_STYLE_MISMATCH', message, { details: { cgroupParent, driver } });
}

/** Parses a cgroup_parent for the systemd driver. */
export function parseSystemdParent(cgroupParent: string): SystemdParent {
  if (cgroupParent === '') return { style: 'systemd', slice: null, path: '' };
  if (!isSystemdStyleParent(cgroupParent)) styleMismatch(cgroupParent, 'systemd');
  const components = cgroupParent.split('/').filter((c) => c !== '');
  const slice = components[components.length - 1] ?? '';
  const path = expandSlice(slice);
  // The kubelet sends the full expanded path; a multi-level path that differs from the slice's
  // own expansion names a nesting systemd cannot create (slices nest only by name prefix).
  if (components.length > 1 && `/${components.join('/')}` !== path) {
    throw invalid(
      'CGROUP_PARENT_INVALID',
      `cgroup_parent "${cgroupParent}" does not match the path "${path}" systemd derives from its slice "${slice}".`,
      { details: { cgroupParent, expected: path } },
    );
  }
  return { style: 'systemd', slice, path };
}

/** Parses a cgroup_parent for the cgroupfs driver. */
export function parseCgroupfsParent(cgroupParent: string): CgroupfsParent {
  if (cgroupParent === '' || cgroupParent === '/') return { style: 'cgroupfs', path: '', components: [] };
  if (isSystemdStyleParent(cgroupParent)) styleMismatch(cgroupParent, 'cgroupfs');
  const components = cgroupParent.split('/').filter((c) => c !== '');
  for (const c of components) {
    if (c === '.' || c === '..' || !CGROUPFS_COMPONENT.test(c) || c.length > CGROUPFS_COMPONENT_MAX) {
      throw invalid(
        'CGROUP_PARENT_INVALID',
        `cgroup_parent "${cgroupParent}" has an unusable path component "${c}" (dot entries, blanks and control characters are not allowed).`,
        { details: { cgroupParent, component: c } },
      );
    }
    // An interface file name (cgroup.procs, memory.max) cannot also be a child cgroup.
    if (c.startsWith('cgroup.')) {
      throw invalid('CGROUP_PARENT_INVALID', `cgroup_parent "${cgroupParent}" has a component "${c}" that names a cgroup interface file.`, {
        details: { cgroupParent, component: c },
      });
    }
  }
  return { style: 'cgroupfs', path: `/${components.join('/')}`, components };
}

/** validateParent for either driver: throws as the driver would, returns nothing. */
export function validateParentFor(driver: CgroupDriverName, cgroupParent: string): void {
  if (driver === 'systemd') parseSystemdParent(cgroupParent);
  else parseCgroupfsParent(cgroupParent);
}

/** The transient scope / cgroup directory name of a sandbox's VMM. */
export function vmmCgroupName(sandboxId: string): string {
  // Sandbox ids are 64 hex characters, or a caller's id by containerd's identifier rule (which
  // allows "."); anything else must still make a valid unit name and a single path component:
  // behind the `kata-ts-` prefix a "." never makes "." or "..", and systemd reads a unit's type
  // after its last ".", which stays `.scope`.
  if (!/^[A-Za-z0-9._-]{1,200}$/.test(sandboxId)) {
    throw invalid('CGROUP_SANDBOX_ID_INVALID', `sandboxId "${sandboxId}" cannot name a cgroup (1-200 letters, digits, ".", "_" or "-").`, {
      details: { sandboxId },
    });
  }
  return `kata-ts-${sandboxId}`;
}
