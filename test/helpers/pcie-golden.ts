/**
 * Golden files for PCIe plans under fixtures/pcie/: `<case>.argv` (one `-device` value per line)
 * and `<case>.plan.txt` (describeTopologyText). Set UPDATE_GOLDEN=1 to rewrite them after a
 * reviewed change; otherwise tests compare byte for byte.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type HostInventory, readHostInventory } from '../../src/pcie/index.js';
import { FIXTURES_DIR, fixtureInventoryOptions } from './pcie-sysfs.js';

export const PCIE_GOLDEN_DIR = path.join(FIXTURES_DIR, 'pcie');

/** argv pairs -> file text: `-device` dropped, one value per line. */
export function argvToGolden(argv: readonly string[]): string {
  const lines: string[] = [];
  for (let i = 0; i < argv.length; i += 2) {
    if (argv[i] !== '-device') throw new Error(`unexpected ${argv[i]}`);
    lines.push(argv[i + 1]!);
  }
  return `${lines.join('\n')}\n`;
}

export function goldenToArgv(text: string): string[] {
  return text
    .split('\n')
    .filter((l) => l !== '')
    .flatMap((l) => ['-device', l]);
}

/** Compare (or with UPDATE_GOLDEN=1, write) a golden file; returns the expected text. */
export async function golden(name: string, actual: string): Promise<string> {
  const file = path.join(PCIE_GOLDEN_DIR, name);
  if (process.env.UPDATE_GOLDEN === '1') {
    await fsp.mkdir(PCIE_GOLDEN_DIR, { recursive: true });
    await fsp.writeFile(file, actual);
    return actual;
  }
  return fsp.readFile(file, 'utf8');
}

const cache = new Map<string, Promise<HostInventory>>();
/** The inventory of a committed fixtures/sysfs tree, read once per test process. */
export function fixtureInventory(name: string): Promise<HostInventory> {
  let p = cache.get(name);
  if (p === undefined) {
    p = readHostInventory(fixtureInventoryOptions(name));
    cache.set(name, p);
  }
  return p;
}
