import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { defaultConfig } from '../../../src/config/defaults.js';
import { inventoryOptionsForRoot, planPodPcie, readPcieHostFacts } from '../../../src/pcie/index.js';
import { FIXTURES_DIR, SYSFS_FIXTURES } from '../../helpers/pcie-sysfs.js';

const SRC_PCIE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../src/pcie');

describe('planPodPcie: from a pod request to argv, on fixture roots', () => {
  it('--sysfs-root on a fixture tree + --cdi-dir: annotation -> CDI -> group -> ports and -device args', async () => {
    const config = defaultConfig();
    const opts = await inventoryOptionsForRoot(path.join(SYSFS_FIXTURES, 'gpu-audio'));
    expect(opts).toEqual({
      sysfsRoot: path.join(SYSFS_FIXTURES, 'gpu-audio/sys'),
      devRoot: path.join(SYSFS_FIXTURES, 'gpu-audio/dev'),
      devNumbersFile: path.join(SYSFS_FIXTURES, 'gpu-audio/dev-numbers.json'),
    });
    const facts = await readPcieHostFacts({ ...config.pcie, cdiSpecDirs: [path.join(FIXTURES_DIR, 'cdi/etc')] }, opts);
    const handler = config.handlers['kata-ts']!;
    const plan = planPodPcie({
      facts,
      annotations: { 'cdi.k8s.io/gpu': 'nvidia.com/pgpu=0' },
      profile: { ...handler.pcie, confidential: handler.confidential },
    });
    expect(plan.devices.sources).toEqual(['cdi_annotations']);
    expect(plan.topology.functions.map((f) => f.portId)).toEqual(['rp0', 'rp1']);
    expect(plan.qemuArgs.filter((a) => a !== '-device')).toHaveLength(4);
    expect(plan.description.ports).toHaveLength(4);
    expect(plan.warnings).toEqual([expect.stringContaining('broken.yaml skipped')]);
    // A plain directory is taken as a sysfs root with the host's /dev.
    expect(await inventoryOptionsForRoot('/sys')).toEqual({ sysfsRoot: '/sys', devRoot: '/dev' });
  });

  it('src/pcie imports only src/common and src/config (and packages), never later layers', async () => {
    const offenders: string[] = [];
    for (const f of await fsp.readdir(SRC_PCIE)) {
      const text = await fsp.readFile(path.join(SRC_PCIE, f), 'utf8');
      for (const m of text.matchAll(/from '(\.[^']+)'/g)) {
        const target = path.relative(path.dirname(SRC_PCIE), path.resolve(SRC_PCIE, m[1]!));
        if (!/^(pcie|common|config)\//.test(target)) offenders.push(`${f}: ${m[1]}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});
