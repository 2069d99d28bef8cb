/**
 * The few TPM 2.0 commands the guest needs, marshalled by hand (TPM 2.0 Library, Part 3): extend
 * a PCR (the initdata binding), read PCRs, make an attestation key and quote PCRs with it. No
 * TSS stack in the guest image: each command is a short byte string written to the kernel's
 * resource-managed device (/dev/tpmrm0) or to swtpm's command socket, and the answer is parsed
 * with every length checked, since a TPM (swtpm run by the host) is outside the guest's trust.
 *
 * Sessions: only the password session TPM_RS_PW with an empty password, which is what an
 * unowned vTPM's hierarchies and the keys made here have.
 */
import { invalid, unavailable } from '../../src/common/errors.js';
import './reasons.js';

/** Sends one command, returns the whole response (tag, size, code and the rest). */
export interface TpmTransport {
  send(command: Buffer): Promise<Buffer>;
  close(): Promise<void>;
}

export const TPM_ST_NO_SESSIONS = 0x8001;
export const TPM_ST_SESSIONS = 0x8002;
export const TPM_ST_ATTEST_QUOTE = 0x8018;
export const TPM_GENERATED_VALUE = 0xff544347;
export const TPM_CC_CREATE_PRIMARY = 0x131;
export const TPM_CC_QUOTE = 0x158;
export const TPM_CC_FLUSH_CONTEXT = 0x165;
export const TPM_CC_PCR_READ = 0x17e;
export const TPM_CC_PCR_EXTEND = 0x182;
export const TPM_RS_PW = 0x40000009;
export const TPM_RH_OWNER = 0x40000001;
export const TPM_RH_ENDORSEMENT = 0x4000000b;
export const TPM_ALG_SHA256 = 0x000b;
export const TPM_ALG_NULL = 0x0010;
export const TPM_ALG_ECDSA = 0x0018;
export const TPM_ALG_ECC = 0x0023;
export const TPM_ECC_NIST_P256 = 0x0003;
/** fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | noDA | restricted | sign. */
export const AK_OBJECT_ATTRIBUTES = 0x00000002 | 0x00000010 | 0x00000020 | 0x00000040 | 0x00000400 | 0x00010000 | 0x00040000;
/** TPM_PCR_SELECT_MIN for a PC client TPM: 24 PCRs, three bytes of bitmap. */
const PCR_SELECT_BYTES = 3;
const SHA256_BYTES = 32;
/** Qualifying data may be as long as the largest digest the TPM has (sha512 on swtpm). */
export const QUOTE_NONCE_MAX_BYTES = 64;
const HEADER_BYTES = 10;
/** What /dev/tpmrm0 and swtpm answer at most (TPM_BUFFER_MAX in the kernel). */
export const TPM_RESPONSE_MAX_BYTES = 4096;

/** Appends big-endian fields; the command header's size is patched in at the end. */
class Writer {
  private readonly parts: Buffer[] = [];
  u8(v: number): this {
    this.parts.push(Buffer.from([v]));
    return this;
  }
  u16(v: number): this {
    const b = Buffer.alloc(2);
    b.writeUInt16BE(v);
    this.parts.push(b);
    return this;
  }
  u32(v: number): this {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(v >>> 0);
    this.parts.push(b);
    return this;
  }
  bytes(b: Buffer): this {
    this.parts.push(b);
    return this;
  }
  /** A TPM2B: a 16-bit size, then the bytes. */
  sized(b: Buffer): this {
    return this.u16(b.length).bytes(b);
  }
  done(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Reads big-endian fields, refusing to read past the end (a short or lying response). */
export class Reader {
  private pos = 0;
  constructor(
    private readonly buf: Buffer,
    private readonly what: string,
  ) {}
  get offset(): number {
    return this.pos;
  }
  get left(): number {
    return this.buf.length - this.pos;
  }
  private need(n: number): void {
    if (this.pos + n > this.buf.length)
      throw invalid('TPM_RESPONSE_MALFORMED', `${this.what}: needs ${n} more bytes at offset ${this.pos}, has ${this.left}`);
  }
  u8(): number {
    this.need(1);
    return this.buf.readUInt8(this.pos++);
  }
  u16(): number {
    this.need(2);
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  u32(): number {
    this.need(4);
    const v = this.buf.readUInt32BE(this.pos);
    this.pos += 4;
    return v;
  }
  u64(): bigint {
    this.need(8);
    const v = this.buf.readBigUInt64BE(this.pos);
    this.pos += 8;
    return v;
  }
  bytes(n: number): Buffer {
    this.need(n);
    const v = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
  sized(): Buffer {
    return this.bytes(this.u16());
  }
  /** The bytes read since `start` (an earlier `offset`). */
  since(start: number): Buffer {
    return this.buf.subarray(start, this.pos);
  }
}

/** A command: header, handles, the password session when `sessions`, then parameters. */
function command(code: number, handles: number[], params: Buffer, sessions: boolean): Buffer {
  const body = new Writer();
  for (const h of handles) body.u32(h);
  if (sessions) {
    // One TPMS_AUTH_COMMAND: TPM_RS_PW, empty nonce, continueSession, empty password.
    const auth = new Writer().u32(TPM_RS_PW).sized(Buffer.alloc(0)).u8(0x01).sized(Buffer.alloc(0)).done();
    body.u32(auth.length).bytes(auth);
  }
  body.bytes(params);
  const rest = body.done();
  return new Writer()
    .u16(sessions ? TPM_ST_SESSIONS : TPM_ST_NO_SESSIONS)
    .u32(HEADER_BYTES + rest.length)
    .u32(code)
    .bytes(rest)
    .done();
}

/** A TPML_PCR_SELECTION of the sha256 bank. */
function pcrSelection(pcrs: readonly number[]): Buffer {
  const bitmap = Buffer.alloc(PCR_SELECT_BYTES);
  for (const p of pcrs) {
    if (!Number.isInteger(p) || p < 0 || p >= PCR_SELECT_BYTES * 8)
      throw invalid('TPM_REQUEST_INVALID', `PCR ${p} is not one of 0-${PCR_SELECT_BYTES * 8 - 1}`);
    bitmap[p >> 3] = (bitmap[p >> 3] ?? 0) | (1 << (p & 7));
  }
  return new Writer().u32(1).u16(TPM_ALG_SHA256).u8(PCR_SELECT_BYTES).bytes(bitmap).done();
}

/** The PCR numbers a TPMS_PCR_SELECTION bitmap names, lowest first (the order the TPM digests them in). */
export function selectedPcrs(bitmap: Buffer): number[] {
  const out: number[] = [];
  for (let i = 0; i < bitmap.length * 8; i++) if (((bitmap[i >> 3] ?? 0) >> (i & 7)) & 1) out.push(i);
  return out;
}

/** Reads a TPML_PCR_SELECTION; returns its banks with their PCRs. */
export function readPcrSelection(r: Reader): Array<{ hashAlg: number; pcrs: number[] }> {
  const count = r.u32();
  if (count > 16) throw invalid('TPM_RESPONSE_MALFORMED', `a PCR selection of ${count} banks`);
  const out: Array<{ hashAlg: number; pcrs: number[] }> = [];
  for (let i = 0; i < count; i++) {
    const hashAlg = r.u16();
    const size = r.u8();
    out.push({ hashAlg, pcrs: selectedPcrs(r.bytes(size)) });
  }
  return out;
}

/** Splits a response into its code and the bytes after the header; checks the declared size. */
export function parseResponseHeader(response: Buffer, what: string): { tag: number; code: number; body: Buffer } {
  const r = new Reader(response, what);
  const tag = r.u16();
  const size = r.u32();
  const code = r.u32();
  if (size !== response.length)
    throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the response says ${size} bytes, ${response.length} arrived`);
  return { tag, code, body: response.subarray(HEADER_BYTES) };
}

/** The response's parameters (after the handle area and, with sessions, the parameterSize field). */
function okBody(response: Buffer, what: string, handles: number): { handles: number[]; params: Reader } {
  const { tag, code, body } = parseResponseHeader(response, what);
  if (code !== 0)
    throw unavailable('TPM_COMMAND_FAILED', `${what}: the TPM answered 0x${code.toString(16).padStart(3, '0')}`, {
      details: { responseCode: code },
    });
  const r = new Reader(body, what);
  const hs: number[] = [];
  for (let i = 0; i < handles; i++) hs.push(r.u32());
  if (tag === TPM_ST_SESSIONS) {
    const paramSize = r.u32();
    return { handles: hs, params: new Reader(r.bytes(paramSize), what) };
  }
  return { handles: hs, params: new Reader(r.bytes(r.left), what) };
}

/** TPM2_PCR_Extend of the sha256 bank of `pcr` with `digestSha256`. */
export function pcrExtendCommand(pcr: number, digestSha256: Buffer): Buffer {
  if (digestSha256.length !== SHA256_BYTES)
    throw invalid('TPM_REQUEST_INVALID', `a sha256 digest is ${SHA256_BYTES} bytes, got ${digestSha256.length}`);
  if (!Number.isInteger(pcr) || pcr < 0 || pcr > 23) throw invalid('TPM_REQUEST_INVALID', `PCR ${pcr} is not one of 0-23`);
  const params = new Writer().u32(1).u16(TPM_ALG_SHA256).bytes(digestSha256).done();
  return command(TPM_CC_PCR_EXTEND, [pcr], params, true);
}

/** TPM2_PCR_Read of the sha256 bank. */
export function pcrReadCommand(pcrs: readonly number[]): Buffer {
  return command(TPM_CC_PCR_READ, [], pcrSelection(pcrs), false);
}

/**
 * The public template of the attestation key: ECC P-256, ECDSA with SHA-256, restricted signing
 * (it signs only what the TPM itself produced, such as a quote), empty unique: a primary key under
 * a hierarchy is then the same key every time for the same hierarchy seed.
 */
export function akTemplate(): Buffer {
  return new Writer()
    .u16(TPM_ALG_ECC)
    .u16(TPM_ALG_SHA256)
    .u32(AK_OBJECT_ATTRIBUTES)
    .sized(Buffer.alloc(0)) // authPolicy
    .u16(TPM_ALG_NULL) // symmetric
    .u16(TPM_ALG_ECDSA)
    .u16(TPM_ALG_SHA256) // scheme and its hash
    .u16(TPM_ECC_NIST_P256)
    .u16(TPM_ALG_NULL) // kdf
    .sized(Buffer.alloc(0))
    .sized(Buffer.alloc(0)) // unique x, y
    .done();
}

/** TPM2_CreatePrimary of the attestation key under `hierarchy`. */
export function createPrimaryCommand(hierarchy: number): Buffer {
  const sensitive = new Writer().sized(Buffer.alloc(0)).sized(Buffer.alloc(0)).done();
  const params = new Writer()
    .sized(sensitive)
    .sized(akTemplate())
    .sized(Buffer.alloc(0)) // outsideInfo
    .u32(0) // creationPCR: none
    .done();
  return command(TPM_CC_CREATE_PRIMARY, [hierarchy], params, true);
}

/** TPM2_Quote with the key's own scheme over sha256 PCRs, `nonce` as qualifying data. */
export function quoteCommand(keyHandle: number, nonce: Buffer, pcrs: readonly number[]): Buffer {
  if (nonce.length > QUOTE_NONCE_MAX_BYTES)
    throw invalid('TPM_REQUEST_INVALID', `the nonce is ${nonce.length} bytes, at most ${QUOTE_NONCE_MAX_BYTES}`);
  const params = new Writer().sized(nonce).u16(TPM_ALG_NULL).bytes(pcrSelection(pcrs)).done();
  return command(TPM_CC_QUOTE, [keyHandle], params, true);
}

/** TPM2_FlushContext: drop a transient object (the attestation key after its quote). */
export function flushContextCommand(handle: number): Buffer {
  return command(TPM_CC_FLUSH_CONTEXT, [], new Writer().u32(handle).done(), false);
}

/** A quote as the guest hands it out: what a verifier needs, all as the TPM produced it. */
export interface TpmQuote {
  /** TPMS_ATTEST, the signed bytes. */
  attest: Buffer;
  /** TPMT_SIGNATURE, as the TPM marshals it. */
  signature: Buffer;
  /** TPMT_PUBLIC of the attestation key. */
  akPublic: Buffer;
  /** The PCRs' sha256 values read right after the quote (the verifier checks them against its digest). */
  pcrValues: Record<number, Buffer>;
}

/** Commands over a transport, one at a time (a TPM takes one command per open channel). */
export class TpmClient {
  private queue: Promise<unknown> = Promise.resolve();
  constructor(private readonly transport: TpmTransport) {}

  private run<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.queue.then(fn, fn);
    this.queue = next.catch(() => undefined);
    return next;
  }

  private send(cmd: Buffer): Promise<Buffer> {
    return this.transport.send(cmd);
  }

  /** Extends the sha256 bank of `pcr` with `digestSha256`. */
  pcrExtend(pcr: number, digestSha256: Buffer): Promise<void> {
    return this.run(async () => {
      okBody(await this.send(pcrExtendCommand(pcr, digestSha256)), 'TPM2_PCR_Extend', 0);
    });
  }

  /** The sha256 values of `pcrs`, keyed by PCR. */
  pcrRead(pcrs: readonly number[]): Promise<Record<number, Buffer>> {
    return this.run(() => this.pcrReadUnqueued(pcrs));
  }

  private async pcrReadUnqueued(pcrs: readonly number[]): Promise<Record<number, Buffer>> {
    const { params } = okBody(await this.send(pcrReadCommand(pcrs)), 'TPM2_PCR_Read', 0);
    params.u32();
    const banks = readPcrSelection(params);
    const count = params.u32();
    const read = banks.filter((b) => b.hashAlg === TPM_ALG_SHA256).flatMap((b) => b.pcrs);
    const out: Record<number, Buffer> = {};
    for (let i = 0; i < count; i++) {
      const p = read[i];
      const v = params.sized();
      if (p !== undefined) out[p] = Buffer.from(v);
    }
    // A TPM returns at most 8 digests per call: ask again for the rest.
    const missing = pcrs.filter((p) => out[p] === undefined);
    if (missing.length > 0 && read.length > 0) Object.assign(out, await this.pcrReadUnqueued(missing));
    return out;
  }

  /**
   * Makes the attestation key under `hierarchy`, quotes `pcrs` with `nonce`, reads the PCRs and
   * flushes the key (transient objects would fill the TPM's few slots).
   */
  quote(nonce: Buffer, pcrs: readonly number[], hierarchy = TPM_RH_ENDORSEMENT): Promise<TpmQuote> {
    return this.run(async () => {
      const created = okBody(await this.send(createPrimaryCommand(hierarchy)), 'TPM2_CreatePrimary', 1);
      const handle = created.handles[0] as number;
      try {
        const akPublic = Buffer.from(created.params.sized());
        const q = okBody(await this.send(quoteCommand(handle, nonce, pcrs)), 'TPM2_Quote', 0).params;
        const attest = Buffer.from(q.sized());
        // TPMT_SIGNATURE for ECDSA: sigAlg, hash, r, s; handed on as marshalled.
        const start = q.offset;
        q.u16();
        q.u16();
        q.sized();
        q.sized();
        const signature = Buffer.from(q.since(start));
        return { attest, signature, akPublic, pcrValues: await this.pcrReadUnqueued(pcrs) };
      } finally {
        await this.send(flushContextCommand(handle)).catch(() => undefined);
      }
    });
  }

  close(): Promise<void> {
    return this.transport.close();
  }
}
