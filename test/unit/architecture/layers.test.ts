/**
 * The layering the README's architecture section describes, held by reading every import:
 * common <- config <- sizing/pcie <- hypervisor <- runtime <- cri (a face) <- daemon (the composition root) <- cli, with cgroups and
 * images beside them, used by the runtime. A new arrow the other way fails here.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

const SRC = path.join(packageRoot(), 'src');

/** Layer of a file (path relative to src/), by its most specific folder. */
function layerOf(rel: string): string {
  if (rel.startsWith('runtime/admission/')) return 'admission';
  if (rel.startsWith('runtime/logs/')) return 'logs';
  return rel.split('/')[0]!.replace(/\.ts$/, '');
}

const ALLOWED: Record<string, string[]> = {
  common: [],
  generated: [],
  config: ['common'],
  sizing: ['common', 'config'],
  pcie: ['common', 'config'],
  manifest: ['common', 'config', 'sizing'],
  cgroups: ['common', 'config'],
  images: ['common', 'config'],
  oci: ['common', 'config', 'generated'],
  hypervisor: ['common', 'config', 'sizing', 'pcie'],
  channel: ['common', 'generated'],
  network: ['common', 'config'],
  'agent-client': ['common', 'channel', 'generated'],
  admission: ['common', 'config', 'sizing'],
  logs: ['common'],
  spdy: ['common'],
  runtime: [
    'common',
    'config',
    'sizing',
    'pcie',
    'hypervisor',
    'cgroups',
    'images',
    'admission',
    'logs',
    'generated',
    'oci',
    'agent-client',
    'channel',
    'network',
  ],
  cri: [
    'common',
    'config',
    'sizing',
    'pcie',
    'hypervisor',
    'cgroups',
    'images',
    'admission',
    'logs',
    'generated',
    'runtime',
    'oci',
    'agent-client',
    'channel',
    'network',
    'spdy',
  ],
  daemon: [
    'common',
    'config',
    'sizing',
    'pcie',
    'hypervisor',
    'cgroups',
    'images',
    'admission',
    'logs',
    'generated',
    'runtime',
    'cri',
    'oci',
    'agent-client',
    'channel',
    'network',
  ],
  cli: [
    'common',
    'config',
    'sizing',
    'pcie',
    'hypervisor',
    'cgroups',
    'images',
    'admission',
    'logs',
    'generated',
    'runtime',
    'cri',
    'daemon',
    'manifest',
    'oci',
    'agent-client',
    'channel',
    'network',
  ],
};

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'generated' ? [] : sourceFiles(full);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') ? [full] : [];
  });
}

function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/^\s*(?:import|export)\b[^'"]*?from\s+'([^']+)'/gm), ...text.matchAll(/import\('([^']+)'\)/g)].map((m) => m[1]!);
}

const files = sourceFiles(SRC);

describe('source layering', () => {
  it('finds the source tree', () => {
    expect(files.length).toBeGreaterThan(50);
  });

  it('every import points down or sideways as the layer table allows', () => {
    const violations: string[] = [];
    for (const file of files) {
      const rel = path.relative(SRC, file);
      const from = layerOf(rel);
      const allowed = ALLOWED[from];
      if (allowed === undefined) {
        violations.push(`${rel}: folder "${from}" is not in the layer table`);
        continue;
      }
      for (const spec of importsOf(file)) {
        if (!spec.startsWith('.')) continue;
        const target = path.relative(SRC, path.resolve(path.dirname(file), spec));
        if (target.startsWith('..')) continue; // package.json and the like
        const to = layerOf(target);
        if (to !== from && !allowed.includes(to)) violations.push(`${rel} imports ${target} (${from} -> ${to})`);
      }
    }
    expect(violations).toEqual([]);
  });

  it('dbus-next is imported by the systemd driver only, grpc-js by the CRI layer and the kubelet client only', () => {
    const offenders: string[] = [];
    for (const file of files) {
      const rel = path.relative(SRC, file);
      for (const spec of importsOf(file)) {
        if (spec === 'dbus-next' && rel !== 'cgroups/systemd.ts') offenders.push(`${rel} imports dbus-next`);
        if (spec.startsWith('@grpc/') && !rel.startsWith('cri/') && rel !== 'pcie/podresources.ts')
          offenders.push(`${rel} imports ${spec}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});
