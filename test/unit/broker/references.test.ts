import { describe, expect, it } from 'vitest';
import type { AttestClaims } from '../../../src/attest/verifier.js';
import { appraise, checkReferenceName, expectedClaims, referenceFromInput } from '../../../src/broker/references.js';
import { isReason } from '../../../src/common/errors.js';
import { hex, snpReference, vtpmReference } from './fixtures.js';

const tpmClaims = (m: Record<string, string>): AttestClaims => ({ tee: 'tpm', measurements: m, details: {} });

describe('reference sets', () => {
  it('map a vtpm document onto tpm_pcrN claims plus init_data, and an snp one onto its launch measurement (host_data is no reference)', () => {
    expect(expectedClaims(vtpmReference({ '4': hex('4'), '9': hex('9') }, hex('d')))).toEqual({
      tpm_pcr4: hex('4'),
      tpm_pcr9: hex('9'),
      init_data: hex('d'),
    });
    expect(expectedClaims(snpReference('ab'.repeat(48)))).toEqual({ snp_launch_measurement: 'ab'.repeat(48) });
  });

  it('match when every named claim is equal (other claims are not judged), and say which differs otherwise', () => {
    const sets = new Map([
      ['a', vtpmReference({ '4': hex('4'), '9': hex('9') })],
      ['b', vtpmReference({ '4': hex('4'), '9': hex('e') }, hex('d'))],
      ['c', snpReference('ab'.repeat(48))],
    ]);
    const result = appraise(tpmClaims({ tpm_pcr4: hex('4'), tpm_pcr9: hex('9'), tpm_pcr7: hex('7') }), sets);
    expect(result.matched).toEqual(['a']);
    expect(result.mismatches).toEqual({
      b: [
        { field: 'tpm_pcr9', reason: 'tpm_pcr9 differs from the reference', expected: hex('e'), actual: hex('9') },
        { field: 'init_data', reason: "init_data is not in the evidence's claims", expected: hex('d') },
      ],
      c: [{ field: 'tee', reason: 'the set is for tee snp, the evidence is tpm', expected: 'snp', actual: 'tpm' }],
    });
  });

  it('compare hex case-insensitively and match several sets at once', () => {
    const sets = new Map([
      ['x', vtpmReference({ '4': hex('a') })],
      ['y', vtpmReference({ '4': hex('a') })],
    ]);
    expect(appraise(tpmClaims({ tpm_pcr4: hex('A') }), sets).matched).toEqual(['x', 'y']);
  });

  it('never match a set that names nothing', () => {
    const empty = vtpmReference({});
    expect(appraise(tpmClaims({ tpm_pcr4: hex('a') }), new Map([['e', empty]])).mismatches.e).toEqual([
      { field: 'reference', reason: 'the set names no measurement' },
    ]);
  });

  it('accept the document itself or a sandbox verbose info carrying it, and refuse anything else naming the field', () => {
    const doc = vtpmReference({ '4': hex('4') });
    expect(referenceFromInput(doc, 'f')).toEqual(doc);
    expect(referenceFromInput({ referenceValues: doc, pid: 1 }, 'f')).toEqual(doc);
    const refused = (input: unknown) => {
      try {
        referenceFromInput(input, 'rv.json');
      } catch (err) {
        expect(isReason(err, 'BROKER_REFERENCE_INVALID')).toBe(true);
        return (err as Error).message;
      }
      throw new Error('expected a refusal');
    };
    expect(refused({ referenceValues: null })).toContain('was not measured');
    expect(refused({ ...doc, tee: 'sev' })).toContain('/tee must be one of');
    expect(refused({ ...doc, vtpm: { ...doc.vtpm, pcrs: { '4': 'XYZ' } } })).toContain('/vtpm/pcrs/4 must match pattern');
    expect(refused({ ...doc, schema: 'other' })).toMatch(/^rv\.json: /);
  });

  it('names: letters, digits, . _ -, up to 63, no leading dot', () => {
    expect(checkReferenceName('web-1.v2_x')).toBe('web-1.v2_x');
    for (const bad of ['', '.x', '../x', 'a/b', 'a'.repeat(64), 'é']) expect(() => checkReferenceName(bad)).toThrow(/reference name/);
  });
});
