/**
 * The TCG PC Client crypto-agile event log (pure): what UEFI firmware records of every PCR extend
 * it makes, as a Linux guest shows it at /sys/kernel/security/tpm0/binary_bios_measurements. A
 * verifier replays it to learn what each PCR should hold and compares that with the quote.
 *
 * Layout (TCG PC Client Platform Firmware Profile, little-endian throughout):
 *   TCG_PCR_EVENT (the SHA-1 era header, one event): pcrIndex u32, eventType u32 (EV_NO_ACTION),
 *     digest[20] (zero), eventSize u32, event = TCG_EfiSpecIDEvent:
 *       signature[16] "Spec ID Event03\0", platformClass u32, specVersionMinor u8,
 *       specVersionMajor u8, specErrata u8, uintnSize u8, numberOfAlgorithms u32,
 *       { algorithmId u16, digestSize u16 } x numberOfAlgorithms, vendorInfoSize u8, vendorInfo
 *   then TCG_PCR_EVENT2 until the end: pcrIndex u32, eventType u32, digestCount u32,
 *     { hashAlg u16, digest[size the Spec ID event gave] } x digestCount, eventSize u32, event
 *
 * Replay: each bank's PCRs start at their reset value (PCRs 17-22 at all ones, the others at zero;
 * PCR 0 at the locality byte when an EV_NO_ACTION "StartupLocality" event says the TPM was
 * started from locality 3 or 4) and every event but EV_NO_ACTION extends its PCR with its digest.
 *
 * The log is untrusted (the guest hands it over): every length is checked against what is left
 * and against the caps below before anything is read or allocated, and any inconsistency is a
 * coded error (ATTEST_EVENT_LOG_INVALID) saying where.
 */
import { createHash, getHashes } from 'node:crypto';
import { invalid } from '../common/errors.js';
import './reasons.js';

export const EVENT_LOG_LIMITS = {
  /** A firmware log is tens of KiB; servers with many option ROMs and certificates reach a few hundred. */
  bytes: 1024 * 1024,
  /** The smallest sha256-only event is 50 bytes: a 1 MiB log cannot hold more than this. */
  events: 20_000,
  /** TPM 2.0 banks defined so far are fewer; a log naming more is not one a firmware wrote. */
  algorithms: 8,
  /** A PC client TPM's PCRs. */
  pcrs: 24,
} as const;

export const EV_NO_ACTION = 0x3;
const SPEC_ID_SIGNATURE = 'Spec ID Event03\0';
const STARTUP_LOCALITY_SIGNATURE = 'StartupLocality\0';
const SHA1_BYTES = 20;

/** Event type names (TCG PC Client Platform Firmware Profile, section 10.4.1). */
export const TCG_EVENT_TYPES: Readonly<Record<number, string>> = {
  0: 'EV_PREBOOT_CERT',
  1: 'EV_POST_CODE',
  2: 'EV_UNUSED',
  3: 'EV_NO_ACTION',
  4: 'EV_SEPARATOR',
  5: 'EV_ACTION',
  6: 'EV_EVENT_TAG',
  7: 'EV_S_CRTM_CONTENTS',
  8: 'EV_S_CRTM_VERSION',
  9: 'EV_CPU_MICROCODE',
  10: 'EV_PLATFORM_CONFIG_FLAGS',
  11: 'EV_TABLE_OF_DEVICES',
  12: 'EV_COMPACT_HASH',
  13: 'EV_IPL',
  14: 'EV_IPL_PARTITION_DATA',
  15: 'EV_NONHOST_CODE',
  16: 'EV_NONHOST_CONFIG',
  17: 'EV_NONHOST_INFO',
  18: 'EV_OMIT_BOOT_DEVICE_EVENTS',
  2147483648: 'EV_EFI_EVENT_BASE',
  2147483649: 'EV_EFI_VARIABLE_DRIVER_CONFIG',
  2147483650: 'EV_EFI_VARIABLE_BOOT',
  2147483651: 'EV_EFI_BOOT_SERVICES_APPLICATION',
  2147483652: 'EV_EFI_BOOT_SERVICES_DRIVER',
  2147483653: 'EV_EFI_RUNTIME_SERVICES_DRIVER',
  2147483654: 'EV_EFI_GPT_EVENT',
  2147483655: 'EV_EFI_ACTION',
  2147483656: 'EV_EFI_PLATFORM_FIRMWARE_BLOB',
  2147483657: 'EV_EFI_HANDOFF_TABLES',
  2147483658: 'EV_EFI_PLATFORM_FIRMWARE_BLOB2',
  2147483659: 'EV_EFI_HANDOFF_TABLES2',
  2147483660: 'EV_EFI_VARIABLE_BOOT2',
  2147483661: 'EV_EFI_GPT_EVENT2',
  2147483664: 'EV_EFI_HCRTM_EVENT',
  2147483872: 'EV_EFI_VARIABLE_AUTHORITY',
  2147483873: 'EV_EFI_SPDM_FIRMWARE_BLOB',
  2147483874: 'EV_EFI_SPDM_FIRMWARE_CONFIG',
};

/** The type's TCG name, or `EV_UNKNOWN_0x...` for one the profile does not define. */
export function eventTypeName(type: number): string {
  return TCG_EVENT_TYPES[type] ?? `EV_UNKNOWN_0x${type.toString(16).padStart(8, '0')}`;
}

/** The TPM hash algorithms an event log may carry: TPM_ALG_ID, name (node:crypto's), digest bytes. */
export const TPM_HASH_ALGORITHMS: ReadonlyArray<{ id: number; name: string; bytes: number }> = [
  { id: 0x0004, name: 'sha1', bytes: 20 },
  { id: 0x000b, name: 'sha256', bytes: 32 },
  { id: 0x000c, name: 'sha384', bytes: 48 },
  { id: 0x000d, name: 'sha512', bytes: 64 },
  { id: 0x0012, name: 'sm3', bytes: 32 },
];
export type BankName = 'sha1' | 'sha256' | 'sha384' | 'sha512' | 'sm3';

/** The log's Spec ID event: which banks every following event carries a digest for. */
export interface SpecIdEvent {
  platformClass: number;
  specVersion: { major: number; minor: number; errata: number };
  uintnSize: number;
  algorithms: Array<{ id: number; name: string; digestBytes: number }>;
  vendorInfo: Buffer;
}

/** One TCG_PCR_EVENT2. */
export interface LogEvent {
  /** Position in the log, the header being 0. */
  index: number;
  /** Byte offset of the event in the log. */
  offset: number;
  pcr: number;
  type: number;
  typeName: string;
  /** Digest per bank, keyed by bank name (`alg_0x....` for an algorithm this module does not know). */
  digests: Record<string, Buffer>;
  data: Buffer;
}

export interface EventLog {
  specId: SpecIdEvent;
  events: LogEvent[];
  /** The locality the TPM was started from, when the log says (EV_NO_ACTION "StartupLocality"). */
  startupLocality: number | null;
}

function bad(message: string, offset: number, event?: number): never {
  throw invalid('ATTEST_EVENT_LOG_INVALID', `the event log ${message}`, {
    details: { field: 'event_log', offset, ...(event === undefined ? {} : { event }) },
  });
}

/** Little-endian reads that never go past the end (the caller names the event on failure). */
class Cursor {
  pos = 0;
  constructor(
    private readonly buf: Buffer,
    private event: number,
  ) {}
  at(event: number): void {
    this.event = event;
  }
  get left(): number {
    return this.buf.length - this.pos;
  }
  private need(n: number, what: string): void {
    if (n > this.left)
      bad(`is truncated in event ${this.event}: ${what} needs ${n} bytes at offset ${this.pos}, ${this.left} left`, this.pos, this.event);
  }
  u8(what: string): number {
    this.need(1, what);
    return this.buf.readUInt8(this.pos++);
  }
  u16(what: string): number {
    this.need(2, what);
    const v = this.buf.readUInt16LE(this.pos);
    this.pos += 2;
    return v;
  }
  u32(what: string): number {
    this.need(4, what);
    const v = this.buf.readUInt32LE(this.pos);
    this.pos += 4;
    return v;
  }
  bytes(n: number, what: string): Buffer {
    this.need(n, what);
    const v = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
}

const algorithmName = (id: number): string =>
  TPM_HASH_ALGORITHMS.find((a) => a.id === id)?.name ?? `alg_0x${id.toString(16).padStart(4, '0')}`;

function parseSpecId(data: Buffer, offset: number): SpecIdEvent {
  const c = new Cursor(data, 0);
  const signature = c.bytes(16, 'the Spec ID signature').toString('latin1');
  if (signature !== SPEC_ID_SIGNATURE)
    bad(`is not crypto-agile: its first event is not a "Spec ID Event03" event (a SHA-1-only log is not verified)`, offset, 0);
  const platformClass = c.u32('platformClass');
  const minor = c.u8('specVersionMinor');
  const major = c.u8('specVersionMajor');
  const errata = c.u8('specErrata');
  const uintnSize = c.u8('uintnSize');
  const count = c.u32('numberOfAlgorithms');
  if (count === 0 || count > EVENT_LOG_LIMITS.algorithms)
    bad(`Spec ID event names ${count} algorithms, not 1-${EVENT_LOG_LIMITS.algorithms}`, offset, 0);
  const algorithms: SpecIdEvent['algorithms'] = [];
  for (let i = 0; i < count; i++) {
    const id = c.u16('algorithmId');
    const digestBytes = c.u16('digestSize');
    const known = TPM_HASH_ALGORITHMS.find((a) => a.id === id);
    if (known !== undefined && known.bytes !== digestBytes)
      bad(`Spec ID event gives ${known.name} a digest of ${digestBytes} bytes, not ${known.bytes}`, offset, 0);
    if (digestBytes === 0 || digestBytes > 128)
      bad(`Spec ID event gives algorithm 0x${id.toString(16)} a digest of ${digestBytes} bytes`, offset, 0);
    if (algorithms.some((a) => a.id === id)) bad(`Spec ID event names algorithm 0x${id.toString(16)} twice`, offset, 0);
    algorithms.push({ id, name: algorithmName(id), digestBytes });
  }
  const vendorInfo = Buffer.from(c.bytes(c.u8('vendorInfoSize'), 'vendorInfo'));
  if (c.left !== 0) bad(`Spec ID event has ${c.left} bytes after its vendor info`, offset, 0);
  return { platformClass, specVersion: { major, minor, errata }, uintnSize, algorithms, vendorInfo };
}

/** Parses a crypto-agile event log (see the file's comment). Throws ATTEST_EVENT_LOG_INVALID naming the offset and event. */
export function parseEventLog(log: Buffer): EventLog {
  if (log.length > EVENT_LOG_LIMITS.bytes) bad(`is ${log.length} bytes, more than the ${EVENT_LOG_LIMITS.bytes} accepted`, 0);
  if (log.length === 0) bad('is empty', 0);
  const c = new Cursor(log, 0);
  const pcr0 = c.u32('pcrIndex');
  const type0 = c.u32('eventType');
  const digest0 = c.bytes(SHA1_BYTES, 'the header digest');
  const size0 = c.u32('eventSize');
  if (pcr0 !== 0 || type0 !== EV_NO_ACTION || !digest0.equals(Buffer.alloc(SHA1_BYTES)))
    bad(
      'is not crypto-agile: it does not start with an EV_NO_ACTION header event of PCR 0 with a zero digest (a SHA-1-only log is not verified)',
      0,
      0,
    );
  const specId = parseSpecId(c.bytes(size0, 'the Spec ID event'), 0);

  const events: LogEvent[] = [];
  let startupLocality: number | null = null;
  for (let index = 1; c.left > 0; index++) {
    if (index > EVENT_LOG_LIMITS.events) bad(`has more than ${EVENT_LOG_LIMITS.events} events`, c.pos, index);
    c.at(index);
    const offset = c.pos;
    const pcr = c.u32('pcrIndex');
    const type = c.u32('eventType');
    if (pcr >= EVENT_LOG_LIMITS.pcrs) bad(`event ${index} names PCR ${pcr}; a TPM has PCRs 0-${EVENT_LOG_LIMITS.pcrs - 1}`, offset, index);
    const count = c.u32('digestCount');
    // Firmware logs every active bank; a log may still leave a bank out of an event, which only
    // a replay of that bank then refuses.
    if (count === 0 || count > specId.algorithms.length)
      bad(`event ${index} carries ${count} digests; the Spec ID event names ${specId.algorithms.length} banks`, offset, index);
    const digests: Record<string, Buffer> = {};
    for (let i = 0; i < count; i++) {
      const id = c.u16('hashAlg');
      const alg = specId.algorithms.find((a) => a.id === id);
      if (alg === undefined)
        bad(`event ${index} has a digest of algorithm 0x${id.toString(16)}, which the Spec ID event does not name`, offset, index);
      if (digests[alg.name] !== undefined) bad(`event ${index} has two ${alg.name} digests`, offset, index);
      digests[alg.name] = Buffer.from(c.bytes(alg.digestBytes, `the ${alg.name} digest`));
    }
    const size = c.u32('eventSize');
    const data = Buffer.from(c.bytes(size, 'the event data'));
    if (
      type === EV_NO_ACTION &&
      pcr === 0 &&
      data.length === 17 &&
      data.subarray(0, 16).toString('latin1') === STARTUP_LOCALITY_SIGNATURE
    ) {
      if (startupLocality !== null) bad(`has a second StartupLocality event (event ${index})`, offset, index);
      startupLocality = data[16] ?? 0;
      if (startupLocality > 4) bad(`says the TPM started from locality ${startupLocality}; localities are 0-4`, offset, index);
    }
    events.push({ index, offset, pcr, type, typeName: eventTypeName(type), digests, data });
  }
  return { specId, events, startupLocality };
}

/** A PCR's value after reset in a bank of `bytes`-byte digests (PCRs 17-22 are the DRTM PCRs, reset to all ones). */
export function pcrResetValue(pcr: number, bytes: number, startupLocality: number | null = null): Buffer {
  if (pcr >= 17 && pcr <= 22) return Buffer.alloc(bytes, 0xff);
  const v = Buffer.alloc(bytes);
  if (pcr === 0 && startupLocality !== null) v[bytes - 1] = startupLocality;
  return v;
}

/** One extend that is not in the firmware's log (the guest agent's own, tpm-evidence.ts AgentExtend). */
export interface ExtraExtend {
  pcr: number;
  digest: Buffer;
}

/**
 * Replays one bank of the log, then `extra` (in order, after the log), into all 24 PCRs: values
 * keyed by PCR number. A null log is a TPM no firmware measured into (sha256 bank only): the
 * extra extends alone, from reset. Throws ATTEST_EVENT_LOG_INVALID when the log has no such bank,
 * an event lacks its digest, or node:crypto cannot compute it.
 */
export function replayEventLog(
  log: EventLog | null,
  bank: BankName = 'sha256',
  extra: readonly ExtraExtend[] = [],
): Record<number, Buffer> {
  const algorithms = log?.specId.algorithms ?? [{ id: 0x000b, name: 'sha256', digestBytes: 32 }];
  const alg = algorithms.find((a) => a.name === bank);
  if (alg === undefined) bad(`has no ${bank} bank (it carries ${algorithms.map((a) => a.name).join(', ')})`, 0);
  if (!getHashes().includes(bank)) bad(`bank ${bank} cannot be computed here`, 0);
  const pcrs: Record<number, Buffer> = {};
  for (let p = 0; p < EVENT_LOG_LIMITS.pcrs; p++) pcrs[p] = pcrResetValue(p, alg.digestBytes, log?.startupLocality ?? null);
  const extend = (pcr: number, digest: Buffer): void => {
    pcrs[pcr] = createHash(bank)
      .update(pcrs[pcr] as Buffer)
      .update(digest)
      .digest();
  };
  for (const e of log?.events ?? []) {
    if (e.type === EV_NO_ACTION) continue;
    const d = e.digests[bank];
    if (d === undefined) bad(`event ${e.index} (PCR ${e.pcr}, ${e.typeName}) has no ${bank} digest to replay`, e.offset, e.index);
    extend(e.pcr, d);
  }
  for (const x of extra) {
    if (!Number.isInteger(x.pcr) || x.pcr < 0 || x.pcr >= EVENT_LOG_LIMITS.pcrs) bad(`extra extend names PCR ${x.pcr}`, 0);
    if (x.digest.length !== alg.digestBytes)
      bad(`extra extend of PCR ${x.pcr} has a ${x.digest.length}-byte digest, not ${alg.digestBytes}`, 0);
    extend(x.pcr, x.digest);
  }
  return pcrs;
}

/** The PCRs the log's events (other than EV_NO_ACTION) extend, lowest first. */
export function extendedPcrs(log: EventLog): number[] {
  return [...new Set(log.events.filter((e) => e.type !== EV_NO_ACTION).map((e) => e.pcr))].sort((a, b) => a - b);
}

/** An event to write with encodeEventLog. */
export interface EncodeEvent {
  pcr: number;
  type: number;
  /** Digest per bank name (every bank of the log). */
  digests: Partial<Record<BankName, Buffer>>;
  data: Buffer;
}

/**
 * Writes a crypto-agile log (the inverse of parseEventLog): the header with a Spec ID event for
 * `banks`, then `events`. For tests and the lab's stand-in firmware, which extends a software TPM
 * the way OVMF would and hands over the log it would have written.
 */
export function encodeEventLog(banks: readonly BankName[], events: readonly EncodeEvent[]): Buffer {
  const algs = banks.map((b) => {
    const a = TPM_HASH_ALGORITHMS.find((x) => x.name === b);
    if (a === undefined) throw invalid('ATTEST_EVENT_LOG_INVALID', `bank ${b} is not a TPM hash algorithm`);
    return a;
  });
  const u32 = (v: number): Buffer => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    return b;
  };
  const u16 = (v: number): Buffer => {
    const b = Buffer.alloc(2);
    b.writeUInt16LE(v);
    return b;
  };
  const spec = Buffer.concat([
    Buffer.from(SPEC_ID_SIGNATURE, 'latin1'),
    u32(0), // platformClass: client
    Buffer.from([0, 2, 0, 2]), // spec version 2.0 errata 0, UINTN of 8 bytes (uintnSize 2)
    u32(algs.length),
    ...algs.flatMap((a) => [u16(a.id), u16(a.bytes)]),
    Buffer.from([0]),
  ]);
  const parts: Buffer[] = [u32(0), u32(EV_NO_ACTION), Buffer.alloc(SHA1_BYTES), u32(spec.length), spec];
  for (const e of events) {
    parts.push(u32(e.pcr), u32(e.type), u32(algs.length));
    for (const a of algs) {
      const d = e.digests[a.name as BankName];
      if (d === undefined || d.length !== a.bytes)
        throw invalid('ATTEST_EVENT_LOG_INVALID', `an event of PCR ${e.pcr} lacks a ${a.bytes}-byte ${a.name} digest`);
      parts.push(u16(a.id), d);
    }
    parts.push(u32(e.data.length), e.data);
  }
  return Buffer.concat(parts);
}

/** The digests of `data` in every bank (an event that measures exactly its data, as EV_SEPARATOR and EV_EFI_ACTION do). */
export function digestsOf(banks: readonly BankName[], data: Buffer): Partial<Record<BankName, Buffer>> {
  return Object.fromEntries(banks.map((b) => [b, createHash(b).update(data).digest()]));
}
