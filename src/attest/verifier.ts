/**
 * The seam between the broker (src/broker) and each kind of evidence it can check (src/attest's
 * tpm, snp and tdx verifiers). The broker runs the KBS protocol and the policy; a verifier turns
 * one TEE's evidence into claims, or into the list of what failed. A verifier is pure apart from
 * the clock it is handed: no I/O, no process state, so the broker's tests and the lab's test tool
 * can run it on any host.
 */
import './reasons.js';

/** The TEE names of trustee's KBS protocol that kata-ts verifies (kbs-types' `Tee`). */
export const VERIFIED_TEES = ['tpm', 'snp', 'tdx'] as const;
export type VerifiedTee = (typeof VERIFIED_TEES)[number];

/** One check that did not pass: which field or measurement, and why, in one sentence. */
export interface AttestFailure {
  /** The claim or evidence field concerned: `tpm_pcr9`, `init_data`, `ek_cert`, `nonce`, ... */
  field: string;
  reason: string;
  expected?: string;
  actual?: string;
}

/**
 * What a verified piece of evidence says, keyed with the names a reference value uses
 * (docs/measurements.md's RVPS mapping: `tpm_pcr4`, `snp_launch_measurement`, `mr_td`, ...,
 * plus `init_data`: the digest of the initdata document the evidence is bound to). Values are
 * lower-case hex.
 */
export interface AttestClaims {
  tee: VerifiedTee;
  measurements: Record<string, string>;
  /** Facts about how it was verified, for the token and the decision log (not judged by policy). */
  details: Record<string, string>;
}

/** What a verifier answers at `/kbs/v0/auth`: extra parameters for the challenge, state for `verify`. */
export interface ChallengeParams {
  /** Sent to the guest as the Challenge's `extra-params` (JSON). */
  extraParams: Record<string, unknown>;
  /** Kept in the broker's session (never sent), handed back to `verify`. */
  sessionState: unknown;
}

/** Everything `verify` may use; every field but the trust anchors came from the guest. */
export interface VerifyInput {
  /** The challenge nonce the broker issued for this session (base64, as sent). */
  nonce: string;
  /** The exact bytes the evidence must be bound to: kbs-protocol.ts `runtimeDataBytes`. */
  runtimeDataBytes: Buffer;
  /** The Attestation's `init-data.body`, when the guest sent one (untrusted until bound). */
  initdataBody: Buffer | null;
  /** The Attestation's `tee-evidence.primary_evidence`, undecoded (untrusted). */
  evidence: unknown;
  sessionState: unknown;
  nowMs: number;
}

export type VerifyResult = { ok: true; claims: AttestClaims } | { ok: false; failures: AttestFailure[] };

/** One TEE's verifier, as the broker holds it. */
export interface EvidenceVerifier {
  tee: VerifiedTee;
  /** Called at `/kbs/v0/auth` with the Request's `extra-params` (untrusted); throws ATTEST_MESSAGE_INVALID. */
  challenge(requestExtraParams: unknown, nonce: string): ChallengeParams;
  verify(input: VerifyInput): VerifyResult;
}
