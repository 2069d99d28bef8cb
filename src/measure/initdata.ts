/**
 * A pod's initdata (pure): the per-pod document (policy, broker address, certificates) that the
 * host hands to the guest and binds to the launch measurement, so that a verifier can tell which
 * document a guest started with.
 *
 * Format (Confidential Containers' initdata spec, as Kata's runtimes read it): the annotation value
 * is base64 (standard alphabet, padded; whitespace ignored) of a gzip stream of a UTF-8 TOML
 * document with `version = "0.1.0"`, `algorithm` one of sha256/sha384/sha512 and a `[data]` table
 * of string values. Extra top-level keys are accepted, as Kata's parser ignores them.
 *
 * Bindings, all over the document bytes exactly as decompressed (what the guest receives):
 * - SEV-SNP HOST_DATA (32 bytes) and TDX MRCONFIGID (48 bytes): the digest named by `algorithm`,
 *   cut to the field's size or padded with zero bytes, as Kata does (sha384 -> first 32 bytes for
 *   SNP; sha256 -> 32 bytes then 16 zeros for TDX).
 * - vTPM: PCR 8 is extended once with sha256 of the document, whatever `algorithm` says, by the
 *   guest before anything in it reads the document (guest/agent/tpm-extend.ts); sha256 because the
 *   predicted bank is sha256 (src/measure/vtpm.ts).
 */
import { createHash } from 'node:crypto';
import { gunzipSync } from 'node:zlib';
import { parse as parseToml } from 'smol-toml';
import { invalid } from '../common/errors.js';
import { extendPcr, ZERO_PCR_SHA256 } from './pcr.js';
import './reasons.js';

/** Kata's annotation (gzip + base64 TOML). */
export const KATA_INITDATA_ANNOTATION = 'io.katacontainers.config.hypervisor.cc_init_data';
/** kata-ts's own annotation, same encoding. */
export const KATA_TS_INITDATA_ANNOTATION = 'io.kata-ts.initdata';
/** Both, in the order they are looked at. */
export const INITDATA_ANNOTATION_KEYS = [KATA_INITDATA_ANNOTATION, KATA_TS_INITDATA_ANNOTATION] as const;
export type InitdataAnnotation = (typeof INITDATA_ANNOTATION_KEYS)[number];

/**
 * The longest annotation value read: Kubernetes caps all of a pod's annotations together at
 * 256 KiB, so nothing longer comes from a kubelet; a direct CRI client gets the same bound.
 */
export const INITDATA_ANNOTATION_MAX_CHARS = 256 * 1024;
/**
 * The largest document accepted after decompression (a gzip stream can expand ~1000-fold):
 * a policy, a few certificates and configs fit many times over, and the guest keeps it in RAM.
 */
export const INITDATA_DOCUMENT_MAX_BYTES = 1024 * 1024;
/** The only spec version there is (Kata refuses others). */
export const INITDATA_VERSION = '0.1.0';
export const INITDATA_ALGORITHMS = ['sha256', 'sha384', 'sha512'] as const;
export type InitdataAlgorithm = (typeof INITDATA_ALGORITHMS)[number];

/** The PCR the guest extends with sha256 of the document (vtpm). */
export const INITDATA_PCR_INDEX = 8;
/** SEV-SNP HOST_DATA's size in the launch and attestation report. */
export const SNP_HOST_DATA_BYTES = 32;
/** TDX MRCONFIGID's size in TD_PARAMS and the TD report. */
export const TDX_MR_CONFIG_ID_BYTES = 48;

/** A decoded, validated initdata document. */
export interface Initdata {
  /** Where it came from. */
  annotation: InitdataAnnotation;
  /** The document bytes, exactly as decompressed: what the guest receives and what is hashed. */
  document: Buffer;
  version: string;
  algorithm: InitdataAlgorithm;
  /** The `[data]` table (file name or key -> text). */
  data: Record<string, string>;
  /** The document's digest in each algorithm (the one `algorithm` names is `digest`). */
  digests: Record<InitdataAlgorithm, Buffer>;
  /** The digest `algorithm` names. */
  digest: Buffer;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function hash(algorithm: InitdataAlgorithm, data: Buffer): Buffer {
  return createHash(algorithm).update(data).digest();
}

function refuse(annotation: string, what: string, cause?: unknown): never {
  throw invalid('MEASURE_INITDATA_INVALID', `annotation ${annotation}: ${what}`, {
    details: { field: `annotations["${annotation}"]` },
    ...(cause === undefined ? {} : { cause }),
  });
}

/**
 * Decodes and validates one annotation value (base64 of gzip of the TOML document). Throws
 * MEASURE_INITDATA_INVALID naming the annotation: bad base64, bad gzip, too large, not UTF-8, bad
 * TOML, wrong version, unknown algorithm, `[data]` missing or not all strings.
 */
export function parseInitdataAnnotation(value: string, annotation: InitdataAnnotation = KATA_INITDATA_ANNOTATION): Initdata {
  if (value.length > INITDATA_ANNOTATION_MAX_CHARS)
    refuse(annotation, `value is ${value.length} characters, more than the ${INITDATA_ANNOTATION_MAX_CHARS} allowed`);
  // Kata drops whitespace before decoding (values wrapped by YAML block scalars).
  const b64 = value.replace(/\s+/g, '');
  if (b64.length === 0) refuse(annotation, 'value is empty');
  if (b64.length % 4 !== 0 || !BASE64.test(b64)) refuse(annotation, 'value is not standard, padded base64');
  const gz = Buffer.from(b64, 'base64');
  let document: Buffer;
  try {
    // One byte over the limit is enough to know it is over, without inflating a bomb.
    document = gunzipSync(gz, { maxOutputLength: INITDATA_DOCUMENT_MAX_BYTES + 1 });
  } catch (err) {
    if ((err as { code?: unknown }).code === 'ERR_BUFFER_TOO_LARGE')
      refuse(annotation, `the document is larger than ${INITDATA_DOCUMENT_MAX_BYTES} bytes once decompressed`);
    refuse(annotation, `value is base64 but not a gzip stream (${(err as Error).message})`, err);
  }
  if (document.length > INITDATA_DOCUMENT_MAX_BYTES)
    refuse(annotation, `the document is larger than ${INITDATA_DOCUMENT_MAX_BYTES} bytes once decompressed`);
  return parseInitdataDocument(document, annotation);
}

/** Validates a document already decompressed (the same checks as parseInitdataAnnotation after gzip). */
export function parseInitdataDocument(document: Buffer, annotation: InitdataAnnotation = KATA_INITDATA_ANNOTATION): Initdata {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(document);
  } catch (err) {
    refuse(annotation, 'the document is not UTF-8 text', err);
  }
  let toml: Record<string, unknown>;
  try {
    toml = parseToml(text) as Record<string, unknown>;
  } catch (err) {
    refuse(annotation, `the document is not TOML: ${(err as Error).message.split('\n')[0]}`, err);
  }
  const { version, algorithm, data } = toml;
  if (typeof version !== 'string') refuse(annotation, 'the document has no string "version"');
  if (version !== INITDATA_VERSION) refuse(annotation, `version "${version}" is not supported (only "${INITDATA_VERSION}")`);
  if (typeof algorithm !== 'string') refuse(annotation, 'the document has no string "algorithm"');
  if (!(INITDATA_ALGORITHMS as readonly string[]).includes(algorithm))
    refuse(annotation, `algorithm "${algorithm}" is not one of ${INITDATA_ALGORITHMS.join(', ')}`);
  if (typeof data !== 'object' || data === null || Array.isArray(data) || data instanceof Date)
    refuse(annotation, 'the document has no [data] table');
  const entries: Record<string, string> = {};
  for (const [k, v] of Object.entries(data)) {
    if (typeof v !== 'string') refuse(annotation, `data."${k}" is not a string`);
    entries[k] = v;
  }
  const digests = {
    sha256: hash('sha256', document),
    sha384: hash('sha384', document),
    sha512: hash('sha512', document),
  };
  const alg = algorithm as InitdataAlgorithm;
  return { annotation, document, version, algorithm: alg, data: entries, digests, digest: digests[alg] };
}

/**
 * The pod's initdata from its annotations, or null without one. Both annotations may be given
 * only when they carry the same document: which one the guest would get is not a guess.
 */
export function initdataFromAnnotations(annotations: Readonly<Record<string, string>> | undefined): Initdata | null {
  const found = INITDATA_ANNOTATION_KEYS.flatMap((k) => {
    const v = annotations?.[k];
    return v === undefined ? [] : [parseInitdataAnnotation(v, k)];
  });
  const [first, second] = found;
  if (first === undefined) return null;
  if (second !== undefined && !second.document.equals(first.document))
    refuse(second.annotation, `carries a different document than annotation ${first.annotation}; give one, or the same in both`);
  return first;
}

/** Cut to `bytes` or padded with zero bytes, Kata's rule for fitting a digest into a TEE field. */
function fitDigest(digest: Buffer, bytes: number): Buffer {
  const out = Buffer.alloc(bytes);
  digest.copy(out, 0, 0, Math.min(bytes, digest.length));
  return out;
}

/** SEV-SNP HOST_DATA (32 bytes): the document's digest in its algorithm, cut or zero-padded. */
export function snpHostData(initdata: Initdata): Buffer {
  return fitDigest(initdata.digest, SNP_HOST_DATA_BYTES);
}

/** TDX MRCONFIGID (48 bytes): the document's digest in its algorithm, cut or zero-padded. */
export function tdxMrConfigId(initdata: Initdata): Buffer {
  return fitDigest(initdata.digest, TDX_MR_CONFIG_ID_BYTES);
}

/** What PCR 8 holds on a vtpm pod: the one extend of sha256(document) from a zero PCR. */
export function vtpmPcr8(initdata: Initdata): { pcr: number; digestSha256: Buffer; value: Buffer } {
  const digestSha256 = initdata.digests.sha256;
  return { pcr: INITDATA_PCR_INDEX, digestSha256, value: extendPcr(ZERO_PCR_SHA256, digestSha256) };
}

/** A TEE kind as the handler's profile resolves it (src/config's TeeKind, restated: measure imports only common). */
export type InitdataTeeKind = 'none' | 'vtpm' | 'snp' | 'tdx';

/** What the launch carries for a pod's initdata: the bytes to hand over and the binding for its TEE. */
export interface InitdataLaunch {
  document: Buffer;
  /** SNP only. */
  snpHostData?: Buffer;
  /** TDX only. */
  tdxMrConfigId?: Buffer;
  /** vtpm only: the PCR the guest extends and its expected value. */
  pcr8?: { digestSha256: Buffer; value: Buffer };
}

/**
 * The binding of a pod's initdata for the TEE its handler resolved to. A pod without a TEE is
 * refused (MEASURE_INITDATA_NO_TEE): kata-ts binds initdata to a launch measurement or does not
 * take it, because a document nothing measures would look bound to a reader of the pod and is
 * not; Kata hands such a document to its guest anyway, where only a sample attester can vouch for it.
 */
export function initdataLaunch(initdata: Initdata, tee: InitdataTeeKind, handler: string): InitdataLaunch {
  switch (tee) {
    case 'none':
      throw invalid(
        'MEASURE_INITDATA_NO_TEE',
        `annotation ${initdata.annotation}: handler "${handler}" has no TEE (tee.kind none), so nothing would bind the initdata document to the launch; use a handler with tee.kind vtpm, snp, tdx or auto`,
        { details: { field: `annotations["${initdata.annotation}"]`, handler } },
      );
    case 'vtpm': {
      const { digestSha256, value } = vtpmPcr8(initdata);
      return { document: initdata.document, pcr8: { digestSha256, value } };
    }
    case 'snp':
      return { document: initdata.document, snpHostData: snpHostData(initdata) };
    case 'tdx':
      return { document: initdata.document, tdxMrConfigId: tdxMrConfigId(initdata) };
  }
}
