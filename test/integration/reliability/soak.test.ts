/**
 * The fault-injection soak, short: about 100 CRI requests over the socket of a real daemon with
 * real VMs (a few boots: the first pod, and one after each fault that ends a VM), one fault of
 * each kind (daemon SIGKILL + restart, QEMU SIGKILL, virtiofsd SIGKILL, a hung guest, the agent
 * SIGKILLed inside the guest, a registry that drops blob transfers, a full state disk), invariants
 * after each fault and at the end (see bench/soak.ts). The long run is documented in bench/README.md.
 */
import { describe, expect, it } from 'vitest';
import { formatSoakReport, runSoak } from '../../../bench/soak.js';
import { scaledMs } from '../../helpers/time-scale.js';

describe('fault-injection soak (short)', () => {
  it(
    'keeps every invariant through one fault of each kind',
    async () => {
      const lines: string[] = [];
      const result = await runSoak({ requests: 140, faults: 7, seed: 17, progress: (l) => lines.push(l) });
      const report = formatSoakReport(result);
      console.log(report);
      expect(result.violations, `${report}\n${lines.join('\n')}`).toEqual([]);
      expect(result.faults).toBe(7);
      expect(Object.values(result.faultKinds).every((n) => n === 1)).toBe(true);
      expect(result.notReadyMs.length).toBe(1);
      expect(result.requests).toBeGreaterThanOrEqual(140);
    },
    scaledMs(900_000),
  );
});
