/**
 * The reference-values document: a prediction becomes a document the schema accepts, bad
 * documents are refused with every bad field named, and the RVPS "sample" mapping names each
 * PCR as trustee's policies query it (tpm_pcrN).
 */
import { describe, expect, it } from 'vitest';
import { sha256 } from '../../../src/measure/pcr.js';
import {
  checkReferenceValues,
  REFERENCE_VALUES_SCHEMA,
  type ReferenceValues,
  rvpsSampleMessage,
  rvpsSampleProvenance,
  vtpmReferenceValues,
} from '../../../src/measure/reference-values.js';
import type { VtpmPrediction } from '../../../src/measure/vtpm.js';
import { thrown } from '../../helpers/kata-error.js';

const hex = (s: string): string => sha256(s).toString('hex');

const prediction: VtpmPrediction = {
  bank: 'sha256',
  pcrs: { 4: hex('4'), 8: hex('8'), 9: hex('9') },
  events: [{ pcr: 4, type: 'EV_SEPARATOR', digestSha256: hex('e'), description: 'end' }],
  firmwarePcrs: [{ pcr: 7, why: 'no vars file' }],
  facts: { kernelAuthenticodeSha256: hex('k'), initrdSha256: hex('i'), initrdAddress: 0x1000, loadOptions: 'x initrd=initrd' },
};

function doc(): ReferenceValues {
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: { name: 'p', namespace: 'default', uid: 'u' },
    handler: 'kata-ts-cvm',
    tee: 'vtpm',
    inputs: { kernelSha256: hex('k'), initrdSha256: hex('i'), cmdline: 'x', ramBelow4GiBBytes: 512 * 1024 * 1024 },
    vtpm: vtpmReferenceValues(prediction),
  };
}

describe('reference values', () => {
  it('a prediction makes a document the schema accepts, through JSON and back', () => {
    const d = doc();
    expect(checkReferenceValues(JSON.parse(JSON.stringify(d)))).toEqual(d);
    expect(d.vtpm?.pcrs).toEqual({ '4': hex('4'), '8': hex('8'), '9': hex('9') });
    expect(d.vtpm?.notPredicted).toEqual([{ pcr: 7, why: 'no vars file' }]);
  });

  it('refuses unknown keys, upper-case or short digests and a wrong schema, naming each', () => {
    const bad = JSON.parse(JSON.stringify(doc()));
    bad.schema = 'other';
    bad.extra = 1;
    bad.vtpm.pcrs['4'] = hex('4').toUpperCase();
    bad.inputs.kernelSha256 = 'abc';
    const e = thrown(() => checkReferenceValues(bad));
    expect(e.reason).toBe('MEASURE_REFERENCE_VALUES_INVALID');
    for (const field of ['/schema', '/extra', '/vtpm/pcrs/4', '/inputs/kernelSha256']) expect(e.message).toContain(field);
  });

  it('maps onto trustee RVPS sample provenance as tpm_pcrN, and wraps it in a register message', () => {
    const d = { ...doc(), snp: { snp_launch_measurement: 'ab'.repeat(48) } };
    expect(rvpsSampleProvenance(d)).toEqual({
      tpm_pcr4: [hex('4')],
      tpm_pcr8: [hex('8')],
      tpm_pcr9: [hex('9')],
      snp_launch_measurement: ['ab'.repeat(48)],
    });
    const m = rvpsSampleMessage(d);
    expect(m.type).toBe('sample');
    expect(m.version).toBe('0.1.0');
    expect(JSON.parse(Buffer.from(m.payload, 'base64').toString('utf8'))).toEqual(rvpsSampleProvenance(d));
  });
});
