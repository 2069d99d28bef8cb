/**
 * The payloads of trustee's KBS protocol (RCAR: Request, Challenge, Attestation, Response; see
 * trustee's kbs/docs/kbs_attestation_protocol.md and the kbs-types crate), as kata-ts's broker
 * (src/broker) answers them and the guest's attester (guest/agent/attest) sends them: their types,
 * their schemas, decoders that refuse anything else naming the field, and `runtimeDataBytes`, the
 * exact bytes a piece of evidence is bound to.
 *
 * Pure: no I/O. Every decoder treats its input as hostile (it came over the network from a guest,
 * or from the broker to a guest).
 */
import { createPublicKey } from 'node:crypto';
import { invalid } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import './reasons.js';

/** The protocol version kata-ts speaks, as trustee's KBS 0.4.x does. */
export const KBS_PROTOCOL_VERSION = '0.4.0';

/**
 * The Request versions the broker accepts. Trustee requires exactly its own version (a semver
 * `=0.4.0` requirement); kata-ts does the same, so a guest built for another protocol revision
 * fails at `/kbs/v0/auth` rather than later on a payload it misreads.
 */
export const ACCEPTED_REQUEST_VERSIONS: readonly string[] = [KBS_PROTOCOL_VERSION];

/** Whether a Request's `version` is one the broker accepts. */
export function isAcceptedVersion(version: string): boolean {
  return ACCEPTED_REQUEST_VERSIONS.includes(version);
}

/**
 * The TEE names a Request may carry (trustee's protocol document and kbs-types' `Tee`, serialised
 * lower-case). The schema accepts all of them; the broker answers those it has no verifier for
 * with an error of its own, so "unknown tee" and "malformed request" stay distinguishable.
 */
export const KBS_TEES = [
  'azsnpvtpm',
  'aztdxvtpm',
  'nvidia',
  'sev',
  'sgx',
  'snp',
  'tdx',
  'cca',
  'csv',
  'se',
  'tpm',
  'sample',
  'sampledevice',
] as const;
export type KbsTee = (typeof KBS_TEES)[number];

/** Size limits of the fields a guest sends, so that nothing unbounded reaches a verifier. */
export const KBS_LIMITS = {
  /** A nonce as kata-ts issues it is 44 characters (32 bytes, base64); trustee's are too. */
  nonceChars: 512,
  /** `init-data.body`: an initdata document (Kata caps the annotation well below this). */
  initdataBodyChars: 256 * 1024,
  /** `tee-evidence.additional_evidence`. */
  additionalEvidenceChars: 1024 * 1024,
  /** A JWT answered in AttestationToken. */
  tokenChars: 64 * 1024,
  /** ErrorInformation's `type` and `detail`. */
  errorTextChars: 4096,
  /** A Request's `version`. */
  versionChars: 64,
} as const;

/** `POST /kbs/v0/auth` body. `extra-params` is TEE-specific (kbs-types holds it as any JSON). */
export interface KbsRequest {
  version: string;
  tee: KbsTee;
  'extra-params': unknown;
}

/** The answer to a Request (plus the `kbs-session-id` cookie). */
export interface KbsChallenge {
  nonce: string;
  'extra-params': unknown;
}

/** RSA public key as a JWK, as the protocol's Key Format section has it. */
export interface TeeRsaPubkey {
  kty: 'RSA';
  alg: 'RSA-OAEP-256';
  n: string;
  e: string;
}

/** Elliptic-curve public key as a JWK; kata-ts accepts P-256 and P-384. */
export interface TeeEcPubkey {
  kty: 'EC';
  crv: 'P-256' | 'P-384';
  alg: 'ECDH-ES+A256KW';
  x: string;
  y: string;
}

/** The key a guest made for this attestation; resources are encrypted to it (jwe.ts). */
export type TeePubkey = TeeRsaPubkey | TeeEcPubkey;

export interface KbsRuntimeData {
  nonce: string;
  'tee-pubkey': TeePubkey;
}

export interface KbsInitData {
  format: 'json' | 'toml';
  body: string;
}

export interface KbsTeeEvidence {
  /** The TEE's own evidence (any JSON; its verifier decodes it). */
  primary_evidence: unknown;
  /** A JSON document as a string, kept as a string on purpose by the protocol. */
  additional_evidence: string;
}

/** `POST /kbs/v0/attest` body. */
export interface KbsAttestation {
  'init-data'?: KbsInitData;
  'runtime-data': KbsRuntimeData;
  'tee-evidence': KbsTeeEvidence;
}

/** The answer to an accepted Attestation. */
export interface KbsAttestationToken {
  token: string;
}

/** trustee's error body: `type` is a URI naming the error kind, `detail` one sentence. */
export interface KbsErrorInformation {
  type: string;
  detail: string;
}

/** trustee's prefix of ErrorInformation `type` URIs (kbs/src/error.rs). */
export const KBS_ERROR_TYPE_PREFIX = 'https://github.com/confidential-containers/kbs/errors';

/**
 * The ErrorInformation types the broker answers with. The names are trustee's error variants
 * where trustee has one for the same situation; the ones trustee has no variant for (it answers
 * those as a generic 401) are kata-ts's own, under the same prefix.
 */
export const KBS_ERROR_TYPES = {
  /** Request or Attestation refused: version, tee, session, evidence, appraisal (trustee: 401). */
  attestation: `${KBS_ERROR_TYPE_PREFIX}/AttestationError`,
  /** The resource path is not `<repository>/<type>/<tag>` (trustee: 404). */
  invalidRequestPath: `${KBS_ERROR_TYPE_PREFIX}/InvalidRequestPath`,
  /** The session has not attested (trustee: 401). */
  tokenNotFound: `${KBS_ERROR_TYPE_PREFIX}/TokenNotFound`,
  /** The policy does not let this session read that resource (trustee: PolicyDeny). */
  policyDeny: `${KBS_ERROR_TYPE_PREFIX}/PolicyDeny`,
  /** The resource could not be encrypted to the session's key. */
  jwe: `${KBS_ERROR_TYPE_PREFIX}/JweError`,
  /** No such resource. */
  resourceNotFound: `${KBS_ERROR_TYPE_PREFIX}/ResourceNotFound`,
  /** Body not JSON or not the payload's schema. */
  malformed: `${KBS_ERROR_TYPE_PREFIX}/MalformedPayload`,
  /** Body over the size cap. */
  payloadTooLarge: `${KBS_ERROR_TYPE_PREFIX}/PayloadTooLarge`,
  /** Content-Type is not application/json. */
  unsupportedMediaType: `${KBS_ERROR_TYPE_PREFIX}/UnsupportedMediaType`,
  /** Method or path the broker does not serve. */
  notFound: `${KBS_ERROR_TYPE_PREFIX}/NotFound`,
  methodNotAllowed: `${KBS_ERROR_TYPE_PREFIX}/MethodNotAllowed`,
  /** Too many live sessions. */
  busy: `${KBS_ERROR_TYPE_PREFIX}/TooManySessions`,
  /** The broker failed; the log has the why. */
  internal: `${KBS_ERROR_TYPE_PREFIX}/InternalError`,
} as const;
export type KbsErrorType = keyof typeof KBS_ERROR_TYPES;

// base64url without padding, as JWK members are (RFC 7518 section 6).
const B64URL = '^[A-Za-z0-9_-]+$';
const PUBKEY_SCHEMA = {
  oneOf: [
    {
      type: 'object',
      additionalProperties: false,
      required: ['kty', 'alg', 'n', 'e'],
      properties: {
        kty: { const: 'RSA' },
        alg: { const: 'RSA-OAEP-256' },
        // 2048 to 8192-bit moduli: 342 to 1366 base64url characters.
        n: { type: 'string', minLength: 342, maxLength: 1366, pattern: B64URL },
        e: { type: 'string', minLength: 1, maxLength: 8, pattern: B64URL },
      },
    },
    {
      type: 'object',
      additionalProperties: false,
      required: ['kty', 'crv', 'alg', 'x', 'y'],
      properties: {
        kty: { const: 'EC' },
        crv: { enum: ['P-256', 'P-384'] },
        alg: { const: 'ECDH-ES+A256KW' },
        x: { type: 'string', minLength: 43, maxLength: 64, pattern: B64URL },
        y: { type: 'string', minLength: 43, maxLength: 64, pattern: B64URL },
      },
    },
  ],
} as const;

const validateRequest = compileOnce<KbsRequest>({
  type: 'object',
  additionalProperties: false,
  required: ['version', 'tee', 'extra-params'],
  properties: {
    version: { type: 'string', minLength: 1, maxLength: KBS_LIMITS.versionChars },
    tee: { enum: [...KBS_TEES] },
    // kbs-types holds it as any JSON value; trustee's own attesters send "" or an object.
    'extra-params': { type: ['object', 'string', 'array', 'number', 'boolean', 'null'] },
  },
});

const validateChallenge = compileOnce<KbsChallenge>({
  type: 'object',
  additionalProperties: false,
  required: ['nonce', 'extra-params'],
  properties: {
    nonce: { type: 'string', minLength: 1, maxLength: KBS_LIMITS.nonceChars },
    'extra-params': { type: ['object', 'string', 'array', 'number', 'boolean', 'null'] },
  },
});

const validateAttestation = compileOnce<KbsAttestation>({
  type: 'object',
  additionalProperties: false,
  required: ['runtime-data', 'tee-evidence'],
  properties: {
    'init-data': {
      type: 'object',
      additionalProperties: false,
      required: ['format', 'body'],
      properties: {
        format: { enum: ['json', 'toml'] },
        body: { type: 'string', maxLength: KBS_LIMITS.initdataBodyChars },
      },
    },
    'runtime-data': {
      type: 'object',
      additionalProperties: false,
      required: ['nonce', 'tee-pubkey'],
      properties: {
        nonce: { type: 'string', minLength: 1, maxLength: KBS_LIMITS.nonceChars },
        'tee-pubkey': PUBKEY_SCHEMA,
      },
    },
    'tee-evidence': {
      type: 'object',
      additionalProperties: false,
      required: ['primary_evidence', 'additional_evidence'],
      properties: {
        primary_evidence: { type: ['object', 'string', 'array'] },
        additional_evidence: { type: 'string', maxLength: KBS_LIMITS.additionalEvidenceChars },
      },
    },
  },
});

const validateToken = compileOnce<KbsAttestationToken>({
  type: 'object',
  additionalProperties: false,
  required: ['token'],
  properties: { token: { type: 'string', minLength: 1, maxLength: KBS_LIMITS.tokenChars } },
});

const validateErrorInformation = compileOnce<KbsErrorInformation>({
  type: 'object',
  additionalProperties: false,
  required: ['type', 'detail'],
  properties: {
    type: { type: 'string', maxLength: KBS_LIMITS.errorTextChars },
    detail: { type: 'string', maxLength: KBS_LIMITS.errorTextChars },
  },
});

/**
 * oneOf errors list every branch's complaint; for the key, the branch the guest meant is the one
 * its `kty` names, so the message keeps that branch's complaints only.
 */
function describe(what: string, errors: Parameters<typeof describeSchemaErrors>[0], doc: unknown): string {
  let list = errors ?? [];
  const kty = pubkeyKty(doc);
  if (kty !== undefined) {
    const branch = kty === 'RSA' ? '/oneOf/0/' : kty === 'EC' ? '/oneOf/1/' : undefined;
    const keyErrors = list.filter((e) => e.schemaPath.includes('/oneOf/'));
    if (branch !== undefined && keyErrors.length > 0) {
      list = list.filter((e) => !e.schemaPath.includes('/oneOf/') || e.schemaPath.includes(branch));
      list = list.filter((e) => e.keyword !== 'oneOf');
    }
  }
  return `${what} is invalid: ${describeSchemaErrors(list).join('; ')}`;
}

function pubkeyKty(doc: unknown): string | undefined {
  if (typeof doc !== 'object' || doc === null) return undefined;
  const rd = (doc as Record<string, unknown>)['runtime-data'];
  if (typeof rd !== 'object' || rd === null) return undefined;
  const key = (rd as Record<string, unknown>)['tee-pubkey'];
  if (typeof key !== 'object' || key === null) return undefined;
  const kty = (key as Record<string, unknown>).kty;
  return typeof kty === 'string' ? kty : undefined;
}

/** Decodes a Request (parsed JSON); throws ATTEST_MESSAGE_INVALID naming the field. */
export function decodeRequest(doc: unknown): KbsRequest {
  const v = validateRequest();
  if (!v(doc)) throw invalid('ATTEST_MESSAGE_INVALID', describe('Request', v.errors, doc));
  return doc;
}

/** Decodes a Challenge (the guest reads the broker's answer with this). */
export function decodeChallenge(doc: unknown): KbsChallenge {
  const v = validateChallenge();
  if (!v(doc)) throw invalid('ATTEST_MESSAGE_INVALID', describe('Challenge', v.errors, doc));
  return doc;
}

/**
 * Decodes an Attestation. Beyond the schema, the `tee-pubkey` must be a usable public key (an EC
 * point on its curve, an RSA modulus and exponent), checked by importing it: a key the broker
 * cannot encrypt to is refused here rather than at the first resource.
 */
export function decodeAttestation(doc: unknown): KbsAttestation {
  const v = validateAttestation();
  if (!v(doc)) throw invalid('ATTEST_MESSAGE_INVALID', describe('Attestation', v.errors, doc));
  checkTeePubkey(doc['runtime-data']['tee-pubkey']);
  return doc;
}

/** Decodes an AttestationToken. */
export function decodeAttestationToken(doc: unknown): KbsAttestationToken {
  const v = validateToken();
  if (!v(doc)) throw invalid('ATTEST_MESSAGE_INVALID', describe('AttestationToken', v.errors, doc));
  return doc;
}

/** Decodes an ErrorInformation (what the guest reads from a refusal). */
export function decodeErrorInformation(doc: unknown): KbsErrorInformation {
  const v = validateErrorInformation();
  if (!v(doc)) throw invalid('ATTEST_MESSAGE_INVALID', describe('ErrorInformation', v.errors, doc));
  return doc;
}

/** Checks that a (schema-valid) tee-pubkey imports as a public key of its declared kind and size. */
export function checkTeePubkey(key: TeePubkey): void {
  const field = '/runtime-data/tee-pubkey';
  let imported: ReturnType<typeof createPublicKey>;
  try {
    // Only the JWK members the schema admitted are handed over, so `alg` never reaches node.
    const jwk = key.kty === 'RSA' ? { kty: 'RSA', n: key.n, e: key.e } : { kty: 'EC', crv: key.crv, x: key.x, y: key.y };
    imported = createPublicKey({ key: jwk, format: 'jwk' });
  } catch (err) {
    throw invalid('ATTEST_MESSAGE_INVALID', `Attestation is invalid: ${field} is not a usable ${key.kty} public key`, { cause: err });
  }
  if (key.kty === 'RSA') {
    const bits = imported.asymmetricKeyDetails?.modulusLength ?? 0;
    if (bits < 2048)
      throw invalid('ATTEST_MESSAGE_INVALID', `Attestation is invalid: ${field}/n is a ${bits}-bit modulus, below 2048 bits`);
  }
}

/**
 * The exact bytes a piece of evidence is bound to: the runtime data as compact JSON with its
 * keys in one fixed order, `{"nonce","tee-pubkey":{"kty","crv","alg","x","y"}}` for an EC key
 * and `{"nonce","tee-pubkey":{"kty","n","alg","e"}}` for an RSA key (the contract's order), and
 * no other member. The guest hashes these into its evidence (TPM qualifying data: sha256; SNP
 * REPORT_DATA / TDX REPORTDATA: sha384), the verifier recomputes them from what it received, so
 * both sides must build them here and never from their own serialisation of the object.
 */
export function runtimeDataBytes(runtimeData: KbsRuntimeData): Buffer {
  const key = runtimeData['tee-pubkey'];
  const ordered =
    key.kty === 'RSA'
      ? { kty: key.kty, n: key.n, alg: key.alg, e: key.e }
      : { kty: key.kty, crv: key.crv, alg: key.alg, x: key.x, y: key.y };
  return Buffer.from(JSON.stringify({ nonce: runtimeData.nonce, 'tee-pubkey': ordered }), 'utf8');
}

/** An ErrorInformation body of one of the broker's error types. */
export function errorInformation(type: KbsErrorType, detail: string): KbsErrorInformation {
  const cut = detail.length > KBS_LIMITS.errorTextChars ? `${detail.slice(0, KBS_LIMITS.errorTextChars - 3)}...` : detail;
  return { type: KBS_ERROR_TYPES[type], detail: cut };
}
