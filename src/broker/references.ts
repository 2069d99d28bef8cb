/**
 * Reference sets and their appraisal. A reference set is a named `kata-ts/reference-values/v1`
 * document (src/measure/reference-values.ts): what `kata-ts plan --measurements --format json`
 * prints, or a sandbox's verbose status `referenceValues`. Appraisal maps each set onto claim
 * names (rvpsSampleProvenance: `tpm_pcrN`, `snp_launch_measurement`, `mr_td`, `rtmr_N`, plus
 * `init_data` from the document's initdata digest) and compares them with the claims a verifier
 * produced: a set matches when its TEE is the evidence's and every value it names is equal. For
 * each set that does not match, appraisal says which claim differs, expected against actual. Pure.
 */

import type { AttestClaims, AttestFailure, VerifiedTee } from '../attest/verifier.js';
import { invalid } from '../common/errors.js';
import { checkReferenceValues, type ReferenceValues, rvpsSampleProvenance } from '../measure/reference-values.js';
import './reasons.js';

/** A reference set's name: also its file name under references/. */
export const REFERENCE_NAME_PATTERN = '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$';
const REFERENCE_NAME = new RegExp(REFERENCE_NAME_PATTERN);

/** Checks a reference set's name; throws BROKER_REFERENCE_INVALID. */
export function checkReferenceName(name: string): string {
  if (!REFERENCE_NAME.test(name))
    throw invalid(
      'BROKER_REFERENCE_INVALID',
      `reference name ${JSON.stringify(name)} must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit`,
      { details: { field: 'name', value: name } },
    );
  return name;
}

/**
 * The reference-values document in what an operator hands `reference add`: the document itself,
 * or an object carrying it as `referenceValues` (a sandbox's verbose status info). Throws
 * BROKER_REFERENCE_INVALID naming the field.
 */
export function referenceFromInput(doc: unknown, source: string): ReferenceValues {
  const inner =
    typeof doc === 'object' && doc !== null && !('schema' in doc) && 'referenceValues' in doc
      ? (doc as { referenceValues: unknown }).referenceValues
      : doc;
  if (inner === null)
    throw invalid('BROKER_REFERENCE_INVALID', `${source} has referenceValues null: the sandbox was not measured (no TEE)`);
  try {
    return checkReferenceValues(inner);
  } catch (err) {
    throw invalid('BROKER_REFERENCE_INVALID', `${source}: ${(err as Error).message}`, { cause: err });
  }
}

/** Parses a reference file's text. */
export function parseReferenceText(text: string, source: string): ReferenceValues {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw invalid('BROKER_REFERENCE_INVALID', `${source} is not JSON: ${(err as Error).message}`, { cause: err });
  }
  return referenceFromInput(doc, source);
}

/** Pure: the TEE a reference document's evidence comes from (a vtpm pod attests with tee "tpm"). */
export function referenceTee(doc: ReferenceValues): VerifiedTee {
  return doc.tee === 'vtpm' ? 'tpm' : doc.tee;
}

/** Pure: the claims a reference set requires, by claim name. */
export function expectedClaims(doc: ReferenceValues): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, values] of Object.entries(rvpsSampleProvenance(doc))) {
    const v = values[0];
    if (v !== undefined) out[name] = v.toLowerCase();
  }
  if (doc.inputs.initdataSha256 !== undefined) out.init_data = doc.inputs.initdataSha256.toLowerCase();
  return out;
}

export interface Appraisal {
  /** Names of the sets the claims match, sorted. */
  matched: string[];
  /** For each set not matched, what differs. */
  mismatches: Record<string, AttestFailure[]>;
}

/** Pure: the claims against every reference set. */
export function appraise(claims: AttestClaims, sets: ReadonlyMap<string, ReferenceValues>): Appraisal {
  const matched: string[] = [];
  const mismatches: Record<string, AttestFailure[]> = {};
  for (const name of [...sets.keys()].sort()) {
    const doc = sets.get(name) as ReferenceValues;
    const failures: AttestFailure[] = [];
    const tee = referenceTee(doc);
    if (tee !== claims.tee) {
      failures.push({
        field: 'tee',
        reason: `the set is for tee ${tee}, the evidence is ${claims.tee}`,
        expected: tee,
        actual: claims.tee,
      });
    } else {
      const expected = expectedClaims(doc);
      if (Object.keys(expected).length === 0) failures.push({ field: 'reference', reason: 'the set names no measurement' });
      for (const [claim, want] of Object.entries(expected)) {
        const got = claims.measurements[claim];
        if (got === undefined) failures.push({ field: claim, reason: `${claim} is not in the evidence's claims`, expected: want });
        else if (got.toLowerCase() !== want)
          failures.push({ field: claim, reason: `${claim} differs from the reference`, expected: want, actual: got.toLowerCase() });
      }
    }
    if (failures.length === 0) matched.push(name);
    else mismatches[name] = failures;
  }
  return { matched, mismatches };
}
