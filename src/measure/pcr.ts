/**
 * TPM 2.0 PCR arithmetic for the SHA-256 bank: a PCR starts at 32 zero bytes and every event
 * replaces it with sha256(old || digest). Predictions replay an event list with this, exactly as
 * a verifier replays a firmware event log.
 */
import { createHash } from 'node:crypto';

/** Bytes of one SHA-256 digest (and of one PCR of the sha256 bank). */
export const SHA256_BYTES = 32;

/** A PCR's value after reset (PCRs 0-15 of a TPM 2.0 start at zero). */
export const ZERO_PCR_SHA256 = Buffer.alloc(SHA256_BYTES);

/** One event that extends a PCR: what a TCG event log entry records, sha256 bank only. */
export interface PcrEvent {
  pcr: number;
  /** The TCG event type name (EV_SEPARATOR, EV_EFI_ACTION, ...). */
  type: string;
  /** The digest that was extended, lower-case hex. */
  digestSha256: string;
  description: string;
}

/** sha256 of `data`. */
export function sha256(data: Buffer | string): Buffer {
  return createHash('sha256').update(data).digest();
}

/** The value of a PCR after extending `digest` into `current`. */
export function extendPcr(current: Buffer, digest: Buffer): Buffer {
  return sha256(Buffer.concat([current, digest]));
}

/**
 * Replays `events` from reset for every PCR in `pcrs` (PCRs no event touches stay zero) and
 * returns lower-case hex values keyed by PCR index.
 */
export function replayPcrs(events: readonly PcrEvent[], pcrs: readonly number[]): Record<number, string> {
  const values = new Map<number, Buffer>(pcrs.map((p) => [p, ZERO_PCR_SHA256]));
  for (const event of events) {
    const current = values.get(event.pcr);
    if (current === undefined) continue;
    values.set(event.pcr, extendPcr(current, Buffer.from(event.digestSha256, 'hex')));
  }
  return Object.fromEntries([...values].map(([p, v]) => [p, v.toString('hex')]));
}

/**
 * The digest of an EV_SEPARATOR event as EDK2 logs it: four zero bytes (a firmware that hit an
 * error would log 0x00000001 instead, which a prediction rightly does not match).
 */
export const SEPARATOR_DIGEST_SHA256 = sha256(Buffer.alloc(4));
