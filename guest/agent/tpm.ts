/**
 * The few TPM 2.0 commands the guest needs, marshalled by hand (TPM 2.0 Library, Part 3): extend
 * a PCR (the initdata binding), read PCRs, make an attestation key and quote PCRs with it, read
 * the EK certificate from NV and prove the attestation key lives beside that EK (credential
 * activation: the EK made from the TCG default template, a policy session satisfying its
 * PolicySecret(endorsement) policy, TPM2_ActivateCredential). No
 * TSS stack in the guest image: each command is a short byte string written to the kernel's
 * resource-managed device (/dev/tpmrm0) or to swtpm's command socket, and the answer is parsed
 * with every length checked, since a TPM (swtpm run by the host) is outside the guest's trust.
 *
 * Sessions: the password session TPM_RS_PW with an empty password, which is what an unowned
 * vTPM's hierarchies and the keys made here have; and, for the EK only, an unsalted, unbound
 * policy session that lives no longer than one activation.
 */
import { randomBytes } from 'node:crypto';
import { objectName } from '../../src/attest/credential.js';
import { invalid, unavailable } from '../../src/common/errors.js';
import { TpmReader } from '../../src/measure/tpm-reader.js';
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
export const TPM_CC_ACTIVATE_CREDENTIAL = 0x147;
export const TPM_CC_NV_READ = 0x14e;
export const TPM_CC_POLICY_SECRET = 0x151;
export const TPM_CC_NV_READ_PUBLIC = 0x169;
export const TPM_CC_START_AUTH_SESSION = 0x176;
export const TPM_CC_GET_CAPABILITY = 0x17a;
export const TPM_RS_PW = 0x40000009;
/** TPM_RC_FAILURE: format zero, "the TPM is in failure mode" (see activateCredential for libtpms' other use of it). */
export const TPM_RC_FAILURE = 0x101;
export const TPM_RH_OWNER = 0x40000001;
export const TPM_RH_NULL = 0x40000007;
export const TPM_RH_ENDORSEMENT = 0x4000000b;
export const TPM_SE_POLICY = 0x01;
export const TPM_CAP_TPM_PROPERTIES = 0x00000006;
/** TPM_PT_NV_BUFFER_MAX (PT_FIXED + 44): the most NV_Read returns at once. */
export const TPM_PT_NV_BUFFER_MAX = 0x0000012c;
/** The TCG's NV index of the RSA 2048 EK certificate (EK Credential Profile, "Low Range"). */
export const EK_RSA_CERT_NV_INDEX = 0x01c00002;
export const TPM_ALG_RSA = 0x0001;
export const TPM_ALG_AES = 0x0006;
export const TPM_ALG_CFB = 0x0043;
export const TPM_ALG_SHA256 = 0x000b;
export const TPM_ALG_NULL = 0x0010;
export const TPM_ALG_ECDSA = 0x0018;
export const TPM_ALG_ECC = 0x0023;
export const TPM_ECC_NIST_P256 = 0x0003;
/** fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | noDA | restricted | sign. */
export const AK_OBJECT_ATTRIBUTES = 0x00000002 | 0x00000010 | 0x00000020 | 0x00000040 | 0x00000400 | 0x00010000 | 0x00040000;
/** fixedTPM | fixedParent | sensitiveDataOrigin | adminWithPolicy | restricted | decrypt: the TCG default EK's. */
export const EK_OBJECT_ATTRIBUTES = 0x00000002 | 0x00000010 | 0x00000020 | 0x00000080 | 0x00010000 | 0x00020000;
/**
 * The TCG default EK's authPolicy: PolicySecret(TPM_RH_ENDORSEMENT), a fact of the EK Credential
 * Profile. Using the EK needs a policy session that ran TPM2_PolicySecret with the endorsement
 * hierarchy's authorization.
 */
export const EK_AUTH_POLICY = Buffer.from('837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa', 'hex');
/** TPMA_NV bits read here. */
const TPMA_NV_OWNERREAD = 0x00020000;
const TPMA_NV_AUTHREAD = 0x00040000;
const TPMA_NV_READLOCKED = 0x10000000;
const TPMA_NV_WRITTEN = 0x20000000;
/** An EK certificate larger than this is not one (they are 1-2 KiB). */
export const EK_CERT_MAX_BYTES = 16 * 1024;
/** NV_Read chunks stay well inside one response (TPM_RESPONSE_MAX_BYTES) whatever the TPM claims. */
const NV_CHUNK_MAX_BYTES = 1024;
/** What a TPM without TPM_PT_NV_BUFFER_MAX is assumed to read at once (the PC client minimum). */
const NV_CHUNK_DEFAULT_BYTES = 512;
/** TPM2B_ID_OBJECT at most: size, a sha512 HMAC TPM2B, a TPM2B_DIGEST of 64 bytes encrypted. */
export const CREDENTIAL_BLOB_MAX_BYTES = 2 + 2 + 64 + 2 + 64;
/** TPM2B_ENCRYPTED_SECRET at most: size, an RSA 4096 ciphertext. */
export const ENCRYPTED_SECRET_MAX_BYTES = 2 + 512;
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

/** Reads big-endian fields, refusing to read past the end (a short or lying response): TPM_RESPONSE_MALFORMED. */
export class Reader extends TpmReader {
  constructor(buf: Buffer, what: string) {
    super(buf, (p) => {
      throw invalid(
        'TPM_RESPONSE_MALFORMED',
        p.kind === 'short'
          ? `${what}: needs ${p.need} more bytes at offset ${p.at}, has ${p.has}`
          : `${what}: ${p.extra} bytes after its end`,
      );
    });
  }
}

/** One TPMS_AUTH_COMMAND: TPM_RS_PW, empty nonce, continueSession, empty password. */
function passwordAuth(): Buffer {
  return new Writer().u32(TPM_RS_PW).sized(Buffer.alloc(0)).u8(0x01).sized(Buffer.alloc(0)).done();
}

/**
 * One TPMS_AUTH_COMMAND for a policy session whose policy asks for no password (PolicySecret
 * ran earlier): empty nonce and empty HMAC. continueSession is kept set so the session
 * outlives the command either way and the caller's flush always finds it.
 */
function policyAuth(session: number): Buffer {
  return new Writer().u32(session).sized(Buffer.alloc(0)).u8(0x01).sized(Buffer.alloc(0)).done();
}

/** A command: header, handles, the authorization area when there are `auths`, then parameters. */
function commandWithAuths(code: number, handles: number[], params: Buffer, auths: Buffer[]): Buffer {
  const body = new Writer();
  for (const h of handles) body.u32(h);
  if (auths.length > 0) {
    const area = Buffer.concat(auths);
    body.u32(area.length).bytes(area);
  }
  body.bytes(params);
  const rest = body.done();
  return new Writer()
    .u16(auths.length > 0 ? TPM_ST_SESSIONS : TPM_ST_NO_SESSIONS)
    .u32(HEADER_BYTES + rest.length)
    .u32(code)
    .bytes(rest)
    .done();
}

/** A command: header, handles, the password session when `sessions`, then parameters. */
function command(code: number, handles: number[], params: Buffer, sessions: boolean): Buffer {
  return commandWithAuths(code, handles, params, sessions ? [passwordAuth()] : []);
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

/** Names of the format-one response codes the commands here may meet (Part 2, TPM_RC). */
const FMT1_NAMES: Readonly<Record<number, string>> = {
  130: 'TPM_RC_ATTRIBUTES',
  131: 'TPM_RC_HASH',
  132: 'TPM_RC_VALUE',
  139: 'TPM_RC_HANDLE',
  142: 'TPM_RC_AUTH_FAIL',
  146: 'TPM_RC_SCHEME',
  149: 'TPM_RC_SIZE',
  153: 'TPM_RC_POLICY_FAIL',
  156: 'TPM_RC_KEY',
  159: 'TPM_RC_INTEGRITY',
};

/** A format-one response code split into its error and the parameter, handle or session it names. */
export function decodeResponseCode(code: number): { error: number; name?: string; parameter?: number; handle?: number; session?: number } {
  if ((code & 0x080) === 0) return { error: code };
  const error = 0x080 | (code & 0x03f);
  const n = (code >> 8) & 0xf;
  const name = FMT1_NAMES[error];
  const where = (code & 0x040) !== 0 ? { parameter: n } : n >= 8 ? { session: n - 8 } : n > 0 ? { handle: n } : {};
  return { error, ...(name === undefined ? {} : { name }), ...where };
}

function describeResponseCode(code: number): string {
  const d = decodeResponseCode(code);
  if (d.name === undefined) return '';
  const where =
    d.parameter !== undefined
      ? ` on parameter ${d.parameter}`
      : d.handle !== undefined
        ? ` on handle ${d.handle}`
        : d.session !== undefined
          ? ` on session ${d.session}`
          : '';
  return ` (${d.name}${where})`;
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
    throw unavailable(
      'TPM_COMMAND_FAILED',
      `${what}: the TPM answered 0x${code.toString(16).padStart(3, '0')}${describeResponseCode(code)}`,
      {
        details: { responseCode: code },
      },
    );
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

/**
 * The TCG EK Credential Profile's default RSA 2048 EK template (L-1): restricted decryption key
 * with AES-128-CFB, usable only through its PolicySecret(endorsement) policy, unique = 256 zero
 * bytes. swtpm_setup makes its RSA EK (and the certificate's key) from it, so this primary is the
 * certified key.
 */
export function ekTemplate(): Buffer {
  return new Writer()
    .u16(TPM_ALG_RSA)
    .u16(TPM_ALG_SHA256)
    .u32(EK_OBJECT_ATTRIBUTES)
    .sized(EK_AUTH_POLICY)
    .u16(TPM_ALG_AES)
    .u16(128)
    .u16(TPM_ALG_CFB) // symmetric
    .u16(TPM_ALG_NULL) // scheme
    .u16(2048) // keyBits
    .u32(0) // exponent: the default 65537
    .sized(Buffer.alloc(256)) // unique
    .done();
}

/** TPM2_CreatePrimary of `template` (the attestation key's unless given) under `hierarchy`. */
export function createPrimaryCommand(hierarchy: number, template: Buffer = akTemplate()): Buffer {
  const sensitive = new Writer().sized(Buffer.alloc(0)).sized(Buffer.alloc(0)).done();
  const params = new Writer()
    .sized(sensitive)
    .sized(template)
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

/** TPM2_GetCapability of one TPM property (TPM_CAP_TPM_PROPERTIES). */
export function getPropertyCommand(property: number): Buffer {
  return command(TPM_CC_GET_CAPABILITY, [], new Writer().u32(TPM_CAP_TPM_PROPERTIES).u32(property).u32(1).done(), false);
}

/** TPM2_NV_ReadPublic of `index`. */
export function nvReadPublicCommand(index: number): Buffer {
  return command(TPM_CC_NV_READ_PUBLIC, [index], Buffer.alloc(0), false);
}

/** TPM2_NV_Read of `size` bytes at `offset` of `index`, authorized by `authHandle`'s empty password. */
export function nvReadCommand(authHandle: number, index: number, size: number, offset: number): Buffer {
  return command(TPM_CC_NV_READ, [authHandle, index], new Writer().u16(size).u16(offset).done(), true);
}

/** TPM2_StartAuthSession: a policy session, unbound and unsalted, no parameter encryption, sha256. */
export function startPolicySessionCommand(nonceCaller: Buffer): Buffer {
  const params = new Writer()
    .sized(nonceCaller)
    .sized(Buffer.alloc(0)) // encryptedSalt
    .u8(TPM_SE_POLICY)
    .u16(TPM_ALG_NULL) // symmetric
    .u16(TPM_ALG_SHA256)
    .done();
  return command(TPM_CC_START_AUTH_SESSION, [TPM_RH_NULL, TPM_RH_NULL], params, false);
}

/** TPM2_PolicySecret(endorsement hierarchy, empty password) on `session`: no nonce, cpHash, ref or expiry. */
export function policySecretCommand(session: number): Buffer {
  const params = new Writer().sized(Buffer.alloc(0)).sized(Buffer.alloc(0)).sized(Buffer.alloc(0)).u32(0).done();
  return command(TPM_CC_POLICY_SECRET, [TPM_RH_ENDORSEMENT, session], params, true);
}

/**
 * TPM2_ActivateCredential: `akHandle` (the object the credential names, password session) and
 * `ekHandle` (the key it is encrypted to, the policy session); the blob and the secret as
 * marshalled TPM2Bs.
 */
export function activateCredentialCommand(
  akHandle: number,
  ekHandle: number,
  session: number,
  credentialBlob: Buffer,
  encryptedSecret: Buffer,
): Buffer {
  return commandWithAuths(TPM_CC_ACTIVATE_CREDENTIAL, [akHandle, ekHandle], Buffer.concat([credentialBlob, encryptedSecret]), [
    passwordAuth(),
    policyAuth(session),
  ]);
}

/** Checks that `b` is one marshalled TPM2B (its size, then exactly that many bytes) of at most `max` bytes in all. */
function checkTpm2b(b: Buffer, field: string, max: number): void {
  if (b.length < 3 || b.length > max)
    throw invalid('TPM_REQUEST_INVALID', `${field} is ${b.length} bytes, a marshalled TPM2B of 3-${max}`, { details: { field } });
  if (b.readUInt16BE(0) !== b.length - 2)
    throw invalid('TPM_REQUEST_INVALID', `${field} says it holds ${b.readUInt16BE(0)} bytes and holds ${b.length - 2}`, {
      details: { field },
    });
}

/** The length of the DER element at the start of `b` (tag, length, content), or undefined when it is none. */
function derLength(b: Buffer): number | undefined {
  if (b.length < 2 || b[0] !== 0x30) return undefined;
  const first = b[1] as number;
  if (first < 0x80) return 2 + first;
  const n = first & 0x7f;
  if (n < 1 || n > 3 || b.length < 2 + n) return undefined;
  let len = 0;
  for (let i = 0; i < n; i++) len = len * 256 + (b[2 + i] as number);
  return 2 + n + len;
}

/** A TPM object's public area, as the TPM produced it. */
export interface TpmObjectPublic {
  /** TPMT_PUBLIC (no size in front). */
  public: Buffer;
  /** Its name: nameAlg, then that hash of `public` (what MakeCredential and TPMS_ATTEST name). */
  name: Buffer;
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

  /** Whether the TPM still runs an ordinary command (a PCR read): one in failure mode does not. */
  private async healthy(): Promise<boolean> {
    try {
      await this.pcrReadUnqueued([0]);
      return true;
    } catch {
      return false;
    }
  }

  /** Flushes a transient object or session; a failure here must not hide the error that led to it. */
  private async flush(handle: number): Promise<void> {
    await this.send(flushContextCommand(handle)).catch(() => undefined);
  }

  /**
   * TPM2_CreatePrimary of `template` under `hierarchy`: the handle and the public area, whose name
   * is computed here and must equal the one the TPM returns. The object is flushed when anything
   * after its creation fails; otherwise the caller flushes it.
   */
  private async createPrimary(hierarchy: number, template: Buffer, what: string): Promise<{ handle: number } & TpmObjectPublic> {
    const created = okBody(await this.send(createPrimaryCommand(hierarchy, template)), what, 1);
    const handle = created.handles[0] as number;
    try {
      const p = created.params;
      const pub = Buffer.from(p.sized());
      p.sized(); // creationData
      p.sized(); // creationHash
      p.u16();
      p.u32();
      p.sized(); // creationTicket
      const tpmName = p.sized();
      let name: Buffer;
      try {
        name = objectName(pub);
      } catch (err) {
        throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the public area returned cannot be named: ${(err as Error).message}`);
      }
      if (!name.equals(tpmName))
        throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the name returned is not the hash of the public area returned`);
      if (pub.length < 2 || pub.readUInt16BE(0) !== template.readUInt16BE(0))
        throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the object made is not of the template's type`);
      return { handle, public: pub, name };
    } catch (err) {
      await this.flush(handle);
      throw err;
    }
  }

  /** The largest NV_Read this TPM answers (TPM_PT_NV_BUFFER_MAX), capped so a chunk fits a response. */
  private async nvChunkBytes(): Promise<number> {
    const { params } = okBody(await this.send(getPropertyCommand(TPM_PT_NV_BUFFER_MAX)), 'TPM2_GetCapability', 0);
    params.u8(); // moreData
    if (params.u32() !== TPM_CAP_TPM_PROPERTIES)
      throw invalid('TPM_RESPONSE_MALFORMED', 'TPM2_GetCapability: the answer is not TPM properties');
    const count = params.u32();
    for (let i = 0; i < count && i < 64; i++) {
      const prop = params.u32();
      const value = params.u32();
      if (prop === TPM_PT_NV_BUFFER_MAX && value > 0) return Math.min(value, NV_CHUNK_MAX_BYTES);
    }
    return NV_CHUNK_DEFAULT_BYTES;
  }

  /**
   * The certificate stored at NV `index` (the RSA EK certificate's by default), DER, read in
   * chunks of at most the TPM's NV buffer. The index's public area is checked to be that index,
   * written, readable with an empty password (its own or the owner's) and of a certificate's
   * size; trailing padding after the DER is dropped. Whether the certificate is any good is the
   * verifier's to judge.
   */
  ekCertificate(index = EK_RSA_CERT_NV_INDEX): Promise<Buffer> {
    return this.run(async () => {
      const what = `TPM2_NV_ReadPublic(0x${index.toString(16)})`;
      const { params } = okBody(await this.send(nvReadPublicCommand(index)), what, 0);
      const nvPublic = new Reader(params.sized(), what);
      const nvIndex = nvPublic.u32();
      nvPublic.u16(); // nameAlg
      const attributes = nvPublic.u32();
      nvPublic.sized(); // authPolicy
      const dataSize = nvPublic.u16();
      if (nvPublic.left !== 0) throw invalid('TPM_RESPONSE_MALFORMED', `${what}: ${nvPublic.left} bytes after the NV public area`);
      if (nvIndex !== index) throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the TPM described index 0x${nvIndex.toString(16)}`);
      if ((attributes & TPMA_NV_WRITTEN) === 0) throw unavailable('TPM_UNAVAILABLE', `NV index 0x${index.toString(16)} was never written`);
      if ((attributes & TPMA_NV_READLOCKED) !== 0) throw unavailable('TPM_UNAVAILABLE', `NV index 0x${index.toString(16)} is read-locked`);
      if (dataSize === 0 || dataSize > EK_CERT_MAX_BYTES)
        throw invalid('TPM_RESPONSE_MALFORMED', `${what}: the index holds ${dataSize} bytes, a certificate is 1-${EK_CERT_MAX_BYTES}`);
      const authHandle = (attributes & TPMA_NV_AUTHREAD) !== 0 ? index : (attributes & TPMA_NV_OWNERREAD) !== 0 ? TPM_RH_OWNER : undefined;
      if (authHandle === undefined)
        throw unavailable(
          'TPM_UNAVAILABLE',
          `NV index 0x${index.toString(16)} is readable neither with its own nor the owner's authorization`,
        );
      const chunk = await this.nvChunkBytes();
      const parts: Buffer[] = [];
      for (let offset = 0; offset < dataSize; offset += chunk) {
        const size = Math.min(chunk, dataSize - offset);
        const r = okBody(await this.send(nvReadCommand(authHandle, index, size, offset)), 'TPM2_NV_Read', 0).params;
        const data = r.sized();
        if (data.length !== size)
          throw invalid('TPM_RESPONSE_MALFORMED', `TPM2_NV_Read: asked for ${size} bytes at ${offset}, got ${data.length}`);
        parts.push(Buffer.from(data));
      }
      const all = Buffer.concat(parts);
      const der = derLength(all);
      if (der === undefined || der > all.length)
        throw invalid(
          'TPM_RESPONSE_MALFORMED',
          `NV index 0x${index.toString(16)} does not hold a DER certificate of at most ${all.length} bytes`,
        );
      return all.subarray(0, der);
    });
  }

  /** The attestation key's public area and name (the key is made under `hierarchy`, read and flushed). */
  akPublic(hierarchy = TPM_RH_ENDORSEMENT): Promise<TpmObjectPublic> {
    return this.run(async () => {
      const ak = await this.createPrimary(hierarchy, akTemplate(), 'TPM2_CreatePrimary(AK)');
      await this.flush(ak.handle);
      return { public: ak.public, name: ak.name };
    });
  }

  /** The EK made from the TCG default RSA template (its public area and name; flushed again). */
  ekPublic(): Promise<TpmObjectPublic> {
    return this.run(async () => {
      const ek = await this.createPrimary(TPM_RH_ENDORSEMENT, ekTemplate(), 'TPM2_CreatePrimary(EK)');
      await this.flush(ek.handle);
      return { public: ek.public, name: ek.name };
    });
  }

  /**
   * Credential activation: makes the attestation key (under `hierarchy`, as `quote` does) and the
   * EK from the TCG default RSA template, satisfies the EK's policy in a fresh policy session
   * (PolicySecret with the endorsement hierarchy's empty password), and has the TPM open
   * `credentialBlob` (TPM2B_ID_OBJECT) with `encryptedSecret` (TPM2B_ENCRYPTED_SECRET). Returns
   * the secret. A credential not made for this EK and this key's name is refused by the TPM:
   * TPM_CREDENTIAL_REFUSED. Both keys and the session are flushed on every path.
   */
  activateCredential(credentialBlob: Buffer, encryptedSecret: Buffer, hierarchy = TPM_RH_ENDORSEMENT): Promise<Buffer> {
    try {
      checkTpm2b(credentialBlob, 'credentialBlob', CREDENTIAL_BLOB_MAX_BYTES);
      checkTpm2b(encryptedSecret, 'encryptedSecret', ENCRYPTED_SECRET_MAX_BYTES);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.run(async () => {
      const handles: number[] = [];
      try {
        const ak = await this.createPrimary(hierarchy, akTemplate(), 'TPM2_CreatePrimary(AK)');
        handles.push(ak.handle);
        const ek = await this.createPrimary(TPM_RH_ENDORSEMENT, ekTemplate(), 'TPM2_CreatePrimary(EK)');
        handles.push(ek.handle);
        const started = okBody(await this.send(startPolicySessionCommand(randomBytes(SHA256_BYTES))), 'TPM2_StartAuthSession', 1);
        const session = started.handles[0] as number;
        handles.push(session);
        if (started.params.sized().length !== SHA256_BYTES)
          throw invalid('TPM_RESPONSE_MALFORMED', 'TPM2_StartAuthSession: the TPM nonce is not a sha256 digest long');
        okBody(await this.send(policySecretCommand(session)), 'TPM2_PolicySecret', 0);
        const answer = await this.send(activateCredentialCommand(ak.handle, ek.handle, session, credentialBlob, encryptedSecret));
        const { code } = parseResponseHeader(answer, 'TPM2_ActivateCredential');
        const d = decodeResponseCode(code);
        // libtpms answers TPM_RC_FAILURE, not a parameter error, when the seed does not decrypt
        // with its EK (RSA-OAEP fails). A TPM that really entered failure mode refuses the next
        // ordinary command too: only a TPM still answering one is taken to have refused the seed.
        if (code === TPM_RC_FAILURE && (await this.healthy()))
          throw invalid(
            'TPM_CREDENTIAL_REFUSED',
            "the TPM refused the credential (TPM_RC_FAILURE decrypting the encrypted secret): it was not made for this TPM's EK, or was altered",
            { details: { responseCode: code } },
          );
        if (code !== 0 && d.parameter !== undefined)
          throw invalid(
            'TPM_CREDENTIAL_REFUSED',
            `the TPM refused the credential (${d.name ?? `0x${code.toString(16)}`} on the ${d.parameter === 1 ? 'credential blob' : 'encrypted secret'}): it was not made for this TPM's EK and this attestation key, or was altered`,
            { details: { responseCode: code } },
          );
        const secret = okBody(answer, 'TPM2_ActivateCredential', 0).params.sized();
        if (secret.length === 0) throw invalid('TPM_RESPONSE_MALFORMED', 'TPM2_ActivateCredential: the TPM returned an empty secret');
        return Buffer.from(secret);
      } finally {
        for (const h of handles.reverse()) await this.flush(h);
      }
    });
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
