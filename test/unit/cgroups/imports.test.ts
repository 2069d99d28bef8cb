/** The cgroups area's import rules: dbus-next only in systemd.ts; src/cgroups imports only common and config. */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

async function tsFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await fsp.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await tsFiles(p)));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

const IMPORT = /(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g;

async function importsOf(file: string): Promise<string[]> {
  const text = await fsp.readFile(file, 'utf8');
  return [...text.matchAll(IMPORT)].map((m) => (m[1] ?? m[2]) as string);
}

describe('cgroups import rules', () => {
  it('dbus-next is imported by src/cgroups/systemd.ts and nothing else in src/', async () => {
    const importers: string[] = [];
    for (const f of await tsFiles('src'))
      if ((await importsOf(f)).some((i) => i === 'dbus-next' || i.startsWith('dbus-next/'))) importers.push(f);
    expect(importers).toEqual([path.join('src', 'cgroups', 'systemd.ts')]);
  });

  it('src/cgroups imports only node:, dbus-next, ../common and ../config, besides itself', async () => {
    for (const f of await tsFiles(path.join('src', 'cgroups'))) {
      for (const i of await importsOf(f)) {
        const ok =
          i.startsWith('node:') || i === 'dbus-next' || i.startsWith('./') || i.startsWith('../common/') || i.startsWith('../config/');
        expect(ok, `${f} imports ${i}`).toBe(true);
      }
    }
  });
});
