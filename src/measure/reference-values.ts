/**
 * The one JSON document kata-ts exports for a verifier: a pod's predicted launch measurements
 * (`kata-ts plan --measurements --format json`), schema `kata-ts/reference-values/v1`.
 *
 * {
 *   "schema": "kata-ts/reference-values/v1",
 *   "pod": { "name", "namespace", "uid" },
 *   "handler": "kata-ts-cvm",
 *   "tee": "vtpm" | "snp" | "tdx",
 *   "inputs": {                       what the values were computed from (hex sha256 of files)
 *     "kernelSha256", "initrdSha256", "cmdline", "ramBelow4GiBBytes",
 *     "ovmfCodeSha256"?, "ovmfVarsSha256"?, "initdataSha256"?
 *   },
 *   "vtpm"?: {
 *     "bank": "sha256",
 *     "pcrs": { "4": hex, "7": hex, "8": hex, "9": hex },   predicted values (lower-case hex)
 *     "events": [ { "pcr", "type", "digestSha256", "description" } ],  in extension order
 *     "notPredicted": [ { "pcr", "why" } ]                 firmware-defined PCRs
 *   },
 *   "snp"?: { name: hex }, "tdx"?: { name: hex }           named launch measurements
 * }
 *
 * Trustee's reference value provider (RVPS) takes a message {"version": "0.1.0", "type":
 * "sample", "payload": base64(JSON {name: [values]})}; its TPM verifier exposes quoted PCRs as
 * claims `tpm.pcrNN` (two digits, lower-case hex) and policies compare them with reference
 * values named `tpm_pcrN`. rvpsSampleProvenance maps the document onto that: each predicted PCR N
 * becomes `tpm_pcrN: [hex]`, snp/tdx measurements keep their names. The sample extractor checks
 * no signature: it is a lab format, as the lab is.
 */
import { invalid } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import type { PcrEvent } from './pcr.js';
import type { FirmwarePcr, VtpmPrediction } from './vtpm.js';
import './reasons.js';

export const REFERENCE_VALUES_SCHEMA = 'kata-ts/reference-values/v1';

export interface ReferenceValueInputs {
  kernelSha256: string;
  initrdSha256: string;
  cmdline: string;
  ramBelow4GiBBytes: number;
  ovmfCodeSha256?: string;
  ovmfVarsSha256?: string;
  initdataSha256?: string;
}

export interface ReferenceValues {
  schema: typeof REFERENCE_VALUES_SCHEMA;
  pod: { name: string; namespace: string; uid: string };
  handler: string;
  tee: 'vtpm' | 'snp' | 'tdx';
  inputs: ReferenceValueInputs;
  vtpm?: { bank: 'sha256'; pcrs: Record<string, string>; events: PcrEvent[]; notPredicted: FirmwarePcr[] };
  snp?: Record<string, string>;
  tdx?: Record<string, string>;
}

const HEX = { type: 'string', pattern: '^([0-9a-f]{2})+$' } as const;
const SHA256_HEX = { type: 'string', pattern: '^[0-9a-f]{64}$' } as const;

const validate = compileOnce<ReferenceValues>({
  type: 'object',
  additionalProperties: false,
  required: ['schema', 'pod', 'handler', 'tee', 'inputs'],
  properties: {
    schema: { const: REFERENCE_VALUES_SCHEMA },
    pod: {
      type: 'object',
      additionalProperties: false,
      required: ['name', 'namespace', 'uid'],
      properties: { name: { type: 'string' }, namespace: { type: 'string' }, uid: { type: 'string' } },
    },
    handler: { type: 'string', minLength: 1 },
    tee: { enum: ['vtpm', 'snp', 'tdx'] },
    inputs: {
      type: 'object',
      additionalProperties: false,
      required: ['kernelSha256', 'initrdSha256', 'cmdline', 'ramBelow4GiBBytes'],
      properties: {
        kernelSha256: SHA256_HEX,
        initrdSha256: SHA256_HEX,
        cmdline: { type: 'string' },
        ramBelow4GiBBytes: { type: 'integer', minimum: 1, maximum: 4294967296 },
        ovmfCodeSha256: SHA256_HEX,
        ovmfVarsSha256: SHA256_HEX,
        initdataSha256: SHA256_HEX,
      },
    },
    vtpm: {
      type: 'object',
      additionalProperties: false,
      required: ['bank', 'pcrs', 'events', 'notPredicted'],
      properties: {
        bank: { const: 'sha256' },
        pcrs: { type: 'object', propertyNames: { pattern: '^(1?[0-9]|2[0-3])$' }, additionalProperties: SHA256_HEX },
        events: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['pcr', 'type', 'digestSha256', 'description'],
            properties: {
              pcr: { type: 'integer', minimum: 0, maximum: 23 },
              type: { type: 'string', minLength: 1 },
              digestSha256: SHA256_HEX,
              description: { type: 'string' },
            },
          },
        },
        notPredicted: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['pcr', 'why'],
            properties: { pcr: { type: 'integer', minimum: 0, maximum: 23 }, why: { type: 'string' } },
          },
        },
      },
    },
    snp: { type: 'object', additionalProperties: HEX },
    tdx: { type: 'object', additionalProperties: HEX },
  },
});

/** Builds the document's vtpm section from a prediction. */
export function vtpmReferenceValues(prediction: VtpmPrediction): NonNullable<ReferenceValues['vtpm']> {
  return {
    bank: prediction.bank,
    pcrs: Object.fromEntries(Object.entries(prediction.pcrs).map(([k, v]) => [String(k), v])),
    events: prediction.events,
    notPredicted: prediction.firmwarePcrs,
  };
}

/** Checks a document (parsed JSON) against the schema; a coded error names every bad field. */
export function checkReferenceValues(doc: unknown): ReferenceValues {
  const v = validate();
  if (!v(doc))
    throw invalid(
      'MEASURE_REFERENCE_VALUES_INVALID',
      `reference values do not match ${REFERENCE_VALUES_SCHEMA}: ${describeSchemaErrors(v.errors).join('; ')}`,
    );
  return doc;
}

/** The `snp` / `tdx` entries that carry the initdata binding, not a measurement. */
const INITDATA_BINDINGS = new Set(['host_data', 'mr_config_id']);

/** Trustee RVPS "sample" provenance: reference-value name -> accepted values. */
export function rvpsSampleProvenance(doc: ReferenceValues): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [pcr, value] of Object.entries(doc.vtpm?.pcrs ?? {})) out[`tpm_pcr${pcr}`] = [value];
  // HOST_DATA and MRCONFIGID are the initdata binding, reported beside the measurement: trustee's
  // verifiers check them against the initdata digest themselves, so they are no reference values.
  for (const [name, value] of [...Object.entries(doc.snp ?? {}), ...Object.entries(doc.tdx ?? {})])
    if (!INITDATA_BINDINGS.has(name)) out[name] = [value];
  return out;
}

/** The message `rvps-tool register --path FILE` takes, carrying rvpsSampleProvenance. */
export function rvpsSampleMessage(doc: ReferenceValues): { version: string; type: 'sample'; payload: string } {
  return { version: '0.1.0', type: 'sample', payload: Buffer.from(JSON.stringify(rvpsSampleProvenance(doc))).toString('base64') };
}
