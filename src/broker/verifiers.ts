/**
 * The broker's evidence verifiers, registered by TEE name (src/attest/verifier.ts
 * EvidenceVerifier). A Request whose `tee` has no entry is refused at `/kbs/v0/auth`.
 *
 * The table is built once at `serve` from the verifiers src/attest provides and the trust anchors
 * the operator gave (the tpm verifier needs the EK CA bundle of the nodes whose pods attest).
 */

import { snpVerifier } from '../attest/snp-verifier.js';
import { tdxVerifier } from '../attest/tdx-verifier.js';
import { tpmVerifier } from '../attest/tpm-verifier.js';
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

/** The trust anchors `serve` hands the built-in verifiers; a TEE without its anchors is not verified. */
export interface VerifierTrust {
  /** PEM bundle of the EK CA certificates (`kata-ts tpm-ca show`), or null when none was found. */
  tpmCaBundlePem: string | null;
  /** PEM bundle of AMD's ARK/ASK (and VLEK) certificates for snp, or null. */
  snpAmdCertsPem?: string | null;
  /** PEM of the Intel SGX root CA for tdx, or null. */
  tdxIntelRootCaPem?: string | null;
}

/** What `serve` registered, and why a verifier was left out, for its start-up line. */
export interface BuiltinVerifiers {
  verifiers: EvidenceVerifier[];
  notes: string[];
}

/**
 * The verifiers of src/attest, each registered when its trust anchors were given: tpm with the
 * EK CA bundle, snp with AMD's certificates, tdx with Intel's root. A bundle that does not parse
 * throws (ATTEST_TRUST_INVALID or ATTEST_EVIDENCE_INVALID): a broker must not start trusting
 * less, or other, than its operator said.
 */
export function builtinVerifiers(trust: VerifierTrust): BuiltinVerifiers {
  const verifiers: EvidenceVerifier[] = [];
  const notes: string[] = [];
  if (trust.tpmCaBundlePem === null)
    notes.push('tpm: not verified (no EK CA bundle: --tpm-ca-bundle, <dir>/tpm-ca-bundle.pem or --tpm-ca-dir)');
  else verifiers.push(tpmVerifier({ caBundlePem: trust.tpmCaBundlePem }));
  const amd = trust.snpAmdCertsPem ?? null;
  if (amd === null) notes.push('snp: not verified (no AMD certificates: --snp-amd-certs)');
  else verifiers.push(snpVerifier({ amdCertsPem: amd }));
  const intel = trust.tdxIntelRootCaPem ?? null;
  if (intel === null) notes.push('tdx: not verified (no Intel SGX root CA: --tdx-intel-root-ca)');
  else verifiers.push(tdxVerifier({ intelRootCaPem: intel }));
  return { verifiers, notes };
}
