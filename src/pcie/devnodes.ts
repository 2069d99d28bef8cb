import { promises as fsp } from 'node:fs';
import { errnoCode, invalid } from '../common/errors.js';

/** A character device's numbers, the key of `/sys/dev/char/<major>:<minor>`. */
export interface DeviceNumbers {
  major: number;
  minor: number;
}

/**
 * How the inventory learns a device node's major:minor. `relPath` is the node's path relative to
 * devRoot (`vfio/12`). Returns undefined when the node is not a character device.
 */
export type DeviceNumberLookup = (absPath: string, relPath: string) => Promise<DeviceNumbers | undefined>;

/**
 * Split a Linux dev_t the way glibc's gnu_dev_major/minor do: the major is bits 8-19 and 32-43,
 * the minor bits 0-7 and 20-31 (the "new" 64-bit encoding that also covers old 16-bit numbers).
 */
export function decodeDevT(rdev: bigint): DeviceNumbers {
  const major = ((rdev >> 8n) & 0xfffn) | ((rdev >> 32n) & ~0xfffn);
  const minor = (rdev & 0xffn) | ((rdev >> 12n) & ~0xffn);
  return { major: Number(major & 0xffffffffn), minor: Number(minor & 0xffffffffn) };
}

/** The real lookup: stat(2) the node and decode st_rdev. The default everywhere but fixtures. */
export const statDeviceNumbers: DeviceNumberLookup = async (absPath) => {
  try {
    const st = await fsp.stat(absPath, { bigint: true });
    if (!st.isCharacterDevice()) return undefined;
    return decodeDevT(st.rdev);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
};

/**
 * The fixture indirection: git cannot store device nodes, so a fixture tree keeps empty files
 * under dev/ and a JSON file mapping each node's path relative to devRoot to `"major:minor"`,
 * e.g. `{ "vfio/12": "243:0", "vfio/devices/vfio0": "511:0" }`. A node missing from the map is
 * treated as "not a character device", as stat(2) would report a regular file.
 */
export async function deviceNumbersFromFile(file: string): Promise<DeviceNumberLookup> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await fsp.readFile(file, 'utf8'));
  } catch (err) {
    throw invalid('PCIE_DEV_NUMBERS_FILE', `device-number file ${file} is not readable JSON`, { cause: err });
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw invalid('PCIE_DEV_NUMBERS_FILE', `device-number file ${file} must be an object of "path": "major:minor"`);
  }
  const table = new Map<string, DeviceNumbers>();
  for (const [rel, value] of Object.entries(parsed)) {
    const m = typeof value === 'string' ? /^(\d+):(\d+)$/.exec(value) : null;
    if (m === null) {
      throw invalid('PCIE_DEV_NUMBERS_FILE', `device-number file ${file} entry "${rel}" must be "major:minor"`);
    }
    table.set(rel, { major: Number(m[1]), minor: Number(m[2]) });
  }
  return async (_absPath, relPath) => table.get(relPath);
}
