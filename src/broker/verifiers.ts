/**
 * The broker's evidence verifiers, registered by TEE name (src/attest/verifier.ts
 * EvidenceVerifier). A Request whose `tee` has no entry is refused at `/kbs/v0/auth`.
 *
 * The table is built once at `serve` from the verifiers src/attest provides and the trust anchors
 * the operator gave (the tpm verifier needs the EK CA bundle of the nodes whose pods attest).
 */

import type { EvidenceVerifier, VerifiedTee } from '../attest/verifier.js';
import { invalid } from '../common/errors.js';
import './reasons.js';

/** The verifiers of a running broker, by TEE name. */
export type VerifierTable = ReadonlyMap<VerifiedTee, EvidenceVerifier>;

/** Builds a table; two verifiers for one TEE are a configuration error (BROKER_CONFIG_INVALID). */
export function verifierTable(verifiers: readonly EvidenceVerifier[]): VerifierTable {
  const table = new Map<VerifiedTee, EvidenceVerifier>();
  for (const v of verifiers) {
    if (table.has(v.tee)) throw invalid('BROKER_CONFIG_INVALID', `two verifiers are registered for tee ${v.tee}`);
    table.set(v.tee, v);
  }
  return table;
}

/** The trust anchors `serve` hands the built-in verifiers. */
export interface VerifierTrust {
  /** PEM bundle of the EK CA certificates (`kata-ts tpm-ca show`), or null when none was found. */
  tpmCaBundlePem: string | null;
}

/** What `serve` registered, and why a verifier was left out, for its start-up line. */
export interface BuiltinVerifiers {
  verifiers: EvidenceVerifier[];
  notes: string[];
}

/**
 * The verifiers this build of kata-ts provides, given the trust anchors. A verifier whose module
 * has not landed in src/attest is absent from the table (its TEE is answered "no verifier"), and
 * the note says so; nothing stands in for it.
 */
export function builtinVerifiers(trust: VerifierTrust): BuiltinVerifiers {
  const notes: string[] = [];
  // src/attest/tpm-verifier.ts (tpmVerifier({caBundlePem})) and snp-/tdx-verifier.ts register here
  // once they exist; until then the broker verifies no TEE by itself and its tests register theirs.
  if (trust.tpmCaBundlePem === null) notes.push('tpm: no EK CA bundle was found');
  notes.push('tpm, snp, tdx: no verifier module in this build');
  return { verifiers: [], notes };
}
