/**
 * The seam between the attester's protocol (client.ts) and the TEE that vouches for the guest:
 * a source answers the Request's `extra-params` and, given the broker's Challenge, the
 * `primary_evidence` bound to the runtime data bytes. kata-ts's guest has one, the TPM of a vtpm
 * pod (tpm-source.ts); SNP and TDX guests would add theirs here.
 */

/** What one attestation asks of the TEE. Each call of `begin` is one attestation (one session). */
export interface EvidenceSource {
  /** The KBS protocol's `tee` name. */
  readonly tee: 'tpm';
  /** Starts one attestation; the round holds whatever must persist from Request to evidence. */
  begin(): Promise<EvidenceRound>;
}

export interface EvidenceRound {
  /** The Request's `extra-params`. */
  requestExtraParams: unknown;
  /** The `tee-evidence.primary_evidence` for the Challenge's `extra-params` and the runtime data bytes. */
  evidence(challengeExtraParams: unknown, runtimeDataBytes: Buffer): Promise<unknown>;
  /** Releases what the round holds (the TPM's channel); called once, whatever happened. */
  end(): Promise<void>;
}
