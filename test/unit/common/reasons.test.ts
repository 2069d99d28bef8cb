/**
 * Reason codes are typed unions per area (src/<area>/reasons.ts, merged into `KataReasons`):
 * a reason no area declares does not compile. `tsc -p tsconfig.json` covers test/, so each
 * `@ts-expect-error` below fails the type check the day a misspelling would compile again.
 */
import { describe, expect, it } from 'vitest';
import { internal, invalid, isKataError, isReason, KataError, type Reason } from '../../../src/common/errors.js';
import type { HypervisorReason } from '../../../src/hypervisor/reasons.js';
import type { SizingReason } from '../../../src/sizing/reasons.js';

describe('reason codes', () => {
  it('a misspelled reason does not compile, in a factory, the constructor or isReason', () => {
    // @ts-expect-error QUANTITY_MALFORMD is declared by no area
    const typo = invalid('QUANTITY_MALFORMD', 'x');
    // @ts-expect-error the constructor takes a Reason too
    const built = new KataError('internal', 'QMP_CLOSD', 'x');
    // @ts-expect-error isReason checks every name it is given
    expect(isReason(typo, 'QUANTITY_MALFORMED', 'QMP_CLOSD')).toBe(false);
    // The misspellings above still ran (types do not exist at run time): the check is the compiler's.
    expect([typo.reason, built.reason]).toEqual(['QUANTITY_MALFORMD', 'QMP_CLOSD']);
  });

  it('comparing a reason with a literal no area declares does not compile either', () => {
    const err: unknown = internal('QMP_CLOSED', 'the QMP socket closed');
    if (isKataError(err)) {
      // @ts-expect-error a Reason never equals an undeclared literal
      expect(err.reason === 'QMP_CLOSD').toBe(false);
      expect(err.reason === 'QMP_CLOSED').toBe(true);
    }
  });

  it('isReason matches any of the names given and narrows the reason to them', () => {
    const err: unknown = invalid('QUANTITY_MALFORMED', 'memory is not a quantity');
    expect(isReason(err, 'QUANTITY_MALFORMED')).toBe(true);
    expect(isReason(err, 'QMP_CLOSED', 'QUANTITY_MALFORMED')).toBe(true);
    expect(isReason(err, 'QMP_CLOSED')).toBe(false);
    expect(isReason(new Error('QUANTITY_MALFORMED'), 'QUANTITY_MALFORMED')).toBe(false);
    expect(isReason(undefined, 'QUANTITY_MALFORMED')).toBe(false);
    if (isReason(err, 'QUANTITY_MALFORMED', 'QUANTITY_MISSING')) {
      const narrowed: SizingReason = err.reason;
      // @ts-expect-error narrowed to the two sizing reasons, which are no hypervisor reasons
      const wrongArea: HypervisorReason = err.reason;
      expect([narrowed, wrongArea]).toEqual(['QUANTITY_MALFORMED', 'QUANTITY_MALFORMED']);
    }
  });

  it('every area contributes its union to Reason', () => {
    const some: Reason[] = ['HANDLER_UNKNOWN', 'SIZING_LIMIT_BELOW_REQUEST', 'PCIE_HOTPLUG_NO_PORT', 'QMP_CLOSED', 'SYSTEMD_UNIT_EXISTS'];
    expect(some).toHaveLength(5);
  });
});
