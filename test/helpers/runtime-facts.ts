import type { RuntimeFacts } from '../../src/runtime/facts.js';

/** Host facts for a SandboxManager built in a unit test: TCG, cgroupfs, QEMU and guest assets present. */
export function testFacts(): RuntimeFacts {
  return {
    configPath: null,
    acceleration: { accel: 'tcg', reason: 'test' },
    cgroupDriver: { name: 'cgroupfs', source: 'config' },
    qemu: { ok: true, message: '' },
    guestAssets: { ok: true, message: '' },
  };
}
