/**
 * The hierarchies the cgroupfs driver works in, found under the cgroup root, and the mapping of
 * file-system errors to precise KataErrors.
 */
import path from 'node:path';
import { errnoCode, internal, KataError, precondition } from '../common/errors.js';
import { CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC } from './fsops.js';
import type { CgroupFs, CgroupMode } from './types.js';

export interface Hierarchy {
  /** Record key: controllers joined by ',' (`cpu`, `cpu,cpuacct`), `systemd`, or `unified`. */
  key: string;
  kind: 'v1' | 'named' | 'unified';
  /** v1 controllers in this hierarchy that kata-ts uses; ['name=systemd'] or [] otherwise. */
  controllers: string[];
  /** Real path of the hierarchy's directory under the cgroup root. */
  base: string;
}

/** v1 controllers the VMM is placed in; cpu and memory carry the limits and are required. */
const V1_REQUIRED = ['cpu', 'memory'];
const V1_OPTIONAL = ['cpuacct', 'pids', 'cpuset'];
/** cgroup2 controllers enabled for the VMM's directory; pids only when available. */
export const V2_REQUIRED = ['cpu', 'memory'];
export const V2_OPTIONAL = ['pids'];

async function magicOf(fs: CgroupFs, p: string): Promise<number | null> {
  try {
    return await fs.fsMagic(p);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return null;
    throw err;
  }
}

/**
 * Finds the hierarchies under `cgroupRoot`. v1 controllers are looked up by name
 * (`<root>/cpu`), and controllers mounted together (`cpu` and `cpuacct` both linking to
 * `cpu,cpuacct`) share one directory, so they are grouped by real path. The named `systemd`
 * hierarchy is joined too when present: the cgroupfs managers of runc and the kubelet do so, and
 * it keeps the VMM visible under its pod to systemd-cgls and friends. In hybrid mode the VMM also
 * joins the (controller-less) unified hierarchy for the same process tracking.
 */
export async function resolveHierarchies(fs: CgroupFs, cgroupRoot: string, mode: CgroupMode): Promise<Hierarchy[]> {
  if (mode === 'v2') {
    return [{ key: 'unified', kind: 'unified', controllers: [], base: await fs.realpath(cgroupRoot) }];
  }
  const byBase = new Map<string, string[]>();
  for (const controller of [...V1_REQUIRED, ...V1_OPTIONAL]) {
    const dir = path.join(cgroupRoot, controller);
    const magic = await magicOf(fs, dir);
    if (magic !== CGROUP_SUPER_MAGIC) {
      if (V1_REQUIRED.includes(controller)) {
        throw precondition('CGROUP_CONTROLLER_MISSING', `the ${controller} controller is not mounted at ${dir}.`, {
          details: { cgroupRoot, controller },
        });
      }
      continue;
    }
    const base = await fs.realpath(dir);
    byBase.set(base, [...(byBase.get(base) ?? []), controller]);
  }
  const out: Hierarchy[] = [...byBase].map(([base, controllers]) => ({ key: controllers.join(','), kind: 'v1', controllers, base }));
  const named = path.join(cgroupRoot, 'systemd');
  const namedMagic = await magicOf(fs, named);
  if (namedMagic === CGROUP_SUPER_MAGIC) {
    out.push({ key: 'systemd', kind: 'named', controllers: ['name=systemd'], base: await fs.realpath(named) });
  }
  if (mode === 'hybrid') {
    const unified = path.join(cgroupRoot, 'unified');
    const magic = await magicOf(fs, unified);
    if (magic !== CGROUP2_SUPER_MAGIC) {
      throw precondition('CGROUP_UNIFIED_MISSING', `cgroup mode is hybrid but ${unified} is not a cgroup2 mount.`, {
        details: { cgroupRoot },
      });
    }
    out.push({ key: 'unified', kind: 'unified', controllers: [], base: await fs.realpath(unified) });
  }
  return out;
}

/** The hierarchy key in a record that holds `controller` ('unified' in v2). */
export function keyHolding(paths: Record<string, string>, mode: CgroupMode, controller: string): string | undefined {
  if (mode === 'v2') return 'unified' in paths ? 'unified' : undefined;
  return Object.keys(paths).find((k) => k !== 'unified' && k !== 'systemd' && k.split(',').includes(controller));
}

/**
 * A failed cgroup file operation as a KataError naming the file (and value); the kernel's errno
 * decides the kind: the host refusing is a precondition, anything else internal.
 */
export function cgroupIoError(err: unknown, op: 'mkdir' | 'read' | 'write' | 'rmdir', file: string, value?: string): KataError {
  if (err instanceof KataError) return err;
  const code = errnoCode(err);
  const details = { file, value, errno: code };
  const what = value === undefined ? file : `${value} to ${file}`;
  switch (code) {
    case 'ESRCH':
      return precondition('CGROUP_PID_GONE', `the VMM process exited before ${what} could be written.`, { cause: err, details });
    case 'ENOENT':
      return precondition('CGROUP_FILE_MISSING', `cgroup file ${file} does not exist (its controller is not enabled there).`, {
        cause: err,
        details,
      });
    case 'EINVAL':
    case 'ERANGE':
      return precondition('CGROUP_WRITE_REFUSED', `the kernel refused writing ${what} (above the parent's limit or out of range).`, {
        cause: err,
        details,
      });
    case 'EBUSY':
      return precondition('CGROUP_BUSY', `the kernel refused to ${op} ${what} because the cgroup is in use.`, { cause: err, details });
    case 'ENOSPC':
      return precondition('CGROUP_NO_CPUSET', `the kernel refused writing ${what} because the cgroup has no CPUs or memory nodes.`, {
        cause: err,
        details,
      });
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return precondition('CGROUP_NOT_WRITABLE', `kata-ts may not ${op} ${file}.`, { cause: err, details });
    default:
      return internal('CGROUP_IO_FAILED', `could not ${op} ${what}.`, { cause: err, details });
  }
}
