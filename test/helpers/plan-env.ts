import path from 'node:path';
import type { PlanEnvironment } from '../../src/cli/plan/report.js';
import { packageRoot } from '../../src/common/paths.js';
import { defaultConfig } from '../../src/config/defaults.js';
import type { KataConfig } from '../../src/config/types.js';
import { inventoryOptionsForRoot, readPcieHostFacts } from '../../src/pcie/index.js';
import type { HostCapacity } from '../../src/sizing/types.js';

/**
 * A fixed planning environment for golden tests: the built-in config, the given host, a real
 * fixture sysfs tree read through the real inventory reader (no IOMMU unless another tree is
 * named), no CDI specs, and TCG, so that plans do not depend on the machine running the tests.
 */
export async function fixturePlanEnvironment(
  host: HostCapacity,
  sysfsFixture = 'no-iommu',
  config: KataConfig = defaultConfig(),
): Promise<PlanEnvironment> {
  const root = path.join(packageRoot(), 'fixtures', 'sysfs', sysfsFixture);
  const pcieFacts = await readPcieHostFacts({ ...config.pcie, cdiSpecDirs: [] }, await inventoryOptionsForRoot(root));
  return { config, host, pcieFacts, accel: { accel: 'tcg', reason: 'fixed for golden plans' } };
}
