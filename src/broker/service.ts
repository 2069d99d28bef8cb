/**
 * The KBS protocol as the broker answers it, without the network: a request (method, path,
 * headers that matter, body bytes already capped) in, a status, headers and a body out. The HTTPS
 * server (server.ts) reads and caps bodies and calls `handle`; the unit tests call it directly
 * with their own clock.
 *
 * Statuses: 400 malformed payload, 401 not authenticated or attestation refused (trustee's
 * answer for both), 403 the policy refuses, 404 unknown path / invalid resource path / no such
 * resource, 405 method, 413 body too large, 415 content type, 503 session table full, 500 a bug
 * (logged). Every refusal carries an ErrorInformation body.
 */
import { encryptResource } from '../attest/jwe.js';
import {
  decodeAttestation,
  decodeRequest,
  errorInformation,
  isAcceptedVersion,
  KBS_PROTOCOL_VERSION,
  type KbsErrorType,
  runtimeDataBytes,
} from '../attest/kbs-protocol.js';
import { formatResourcePath, KBS_RESOURCE_PREFIX, parseResourcePath } from '../attest/resource-path.js';
import type { AttestFailure, VerifiedTee, VerifyResult } from '../attest/verifier.js';
import { errorMessage, isKataError, isReason } from '../common/errors.js';
import type { DecisionSink } from './decisions.js';
import { decideResource } from './policy.js';
import { appraise } from './references.js';
import { freshNonce, type Session, type SessionTable, sessionCookieHeader, sessionIdOfCookie } from './sessions.js';
import type { LiveConfig } from './store.js';
import { claimsDigest, type TokenSigner } from './token.js';
import type { VerifierTable } from './verifiers.js';
import './reasons.js';

/** Body caps by endpoint, checked before anything is parsed. */
export const BODY_LIMITS = {
  /** A Request: version, tee and extra-params (a tpm Request carries an EK certificate and an AK). */
  authBytes: 64 * 1024,
  /** An Attestation: a tpm one carries the firmware event log (up to 1 MiB, base64). */
  attestBytes: 4 * 1024 * 1024,
} as const;

export interface BrokerRequest {
  method: string;
  /** The request target as sent (path and maybe a query), not normalised. */
  url: string;
  contentType: string | undefined;
  cookie: string | undefined;
  body: Buffer;
}

export interface BrokerResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** The configuration a service reads on every decision (store.ts LiveConfig, or a test's). */
export type ServiceConfig = Pick<LiveConfig, 'policy' | 'references' | 'refresh' | 'readResource'>;

export interface BrokerServiceOptions {
  verifiers: VerifierTable;
  config: ServiceConfig;
  signer: TokenSigner;
  sessions: SessionTable;
  log: DecisionSink;
  now?: () => number;
}

const JSON_HEADERS = { 'content-type': 'application/json' };

function json(status: number, body: unknown, headers: Record<string, string> = {}): BrokerResponse {
  return { status, headers: { ...JSON_HEADERS, ...headers }, body: JSON.stringify(body) };
}

function refuse(status: number, type: KbsErrorType, detail: string): BrokerResponse {
  return json(status, errorInformation(type, detail));
}

/** Pure: is a Content-Type header JSON? (`application/json`, any parameters.) */
export function isJsonContentType(header: string | undefined): boolean {
  if (header === undefined) return false;
  return header.split(';')[0]?.trim().toLowerCase() === 'application/json';
}

function parseJson(body: Buffer): { ok: true; doc: unknown } | { ok: false; why: string } {
  try {
    return { ok: true, doc: JSON.parse(body.toString('utf8')) };
  } catch (err) {
    return { ok: false, why: errorMessage(err) };
  }
}

/** One line per failure, for ErrorInformation details. */
export function describeFailures(failures: readonly AttestFailure[]): string {
  return failures
    .map(
      (f) =>
        `${f.field}: ${f.reason}${f.expected !== undefined ? ` (expected ${f.expected}${f.actual !== undefined ? `, got ${f.actual}` : ''})` : ''}`,
    )
    .join('; ');
}

export class BrokerService {
  private readonly now: () => number;

  constructor(private readonly opts: BrokerServiceOptions) {
    this.now = opts.now ?? Date.now;
  }

  /** Answers one request; never throws (a bug is a 500 and an `error` decision line). */
  async handle(req: BrokerRequest): Promise<BrokerResponse> {
    try {
      return await this.route(req);
    } catch (err) {
      this.opts.log.record({ event: 'error', outcome: 'failed', method: req.method, url: req.url.slice(0, 200), error: errorMessage(err) });
      return refuse(500, 'internal', 'the broker failed on this request; its log says why');
    }
  }

  private async route(req: BrokerRequest): Promise<BrokerResponse> {
    const target = req.url.split('?')[0] ?? '';
    // Refusals before a payload is read are decisions too: logged under the endpoint's event.
    const early = (event: 'auth' | 'attest' | 'resource' | 'error', status: number, type: KbsErrorType, detail: string, headers = {}) => {
      this.opts.log.record({
        event,
        outcome: 'refused',
        status,
        method: req.method.slice(0, 16),
        url: req.url.slice(0, 200),
        reason: detail,
      });
      const r = refuse(status, type, detail);
      return { ...r, headers: { ...r.headers, ...headers } };
    };
    if (target === '/kbs/v0/auth' || target === '/kbs/v0/attest') {
      const event = target === '/kbs/v0/auth' ? 'auth' : 'attest';
      if (req.method !== 'POST') return early(event, 405, 'methodNotAllowed', `${target} takes POST`, { allow: 'POST' });
      if (!isJsonContentType(req.contentType))
        return early(event, 415, 'unsupportedMediaType', `${target} takes application/json, got ${JSON.stringify(req.contentType ?? '')}`);
      const cap = event === 'auth' ? BODY_LIMITS.authBytes : BODY_LIMITS.attestBytes;
      if (req.body.byteLength > cap) return early(event, 413, 'payloadTooLarge', `${target} takes at most ${cap} bytes`);
      await this.opts.config.refresh();
      return event === 'auth' ? this.auth(req) : this.attest(req);
    }
    if (target.startsWith(KBS_RESOURCE_PREFIX)) {
      if (req.method !== 'GET') return early('resource', 405, 'methodNotAllowed', 'resources are read with GET', { allow: 'GET' });
      await this.opts.config.refresh();
      return this.resource(req, req.url.slice(KBS_RESOURCE_PREFIX.length));
    }
    return early('error', 404, 'notFound', 'the broker serves /kbs/v0/auth, /kbs/v0/attest and /kbs/v0/resource/<repository>/<type>/<tag>');
  }

  private auth(req: BrokerRequest): BrokerResponse {
    const parsed = parseJson(req.body);
    if (!parsed.ok) return this.authRefused(400, 'malformed', `Request is not JSON: ${parsed.why}`);
    let request: ReturnType<typeof decodeRequest>;
    try {
      request = decodeRequest(parsed.doc);
    } catch (err) {
      return this.authRefused(400, 'malformed', errorMessage(err));
    }
    if (!isAcceptedVersion(request.version))
      return this.authRefused(
        401,
        'attestation',
        `KBS protocol version ${JSON.stringify(request.version)} is not accepted; this broker speaks ${KBS_PROTOCOL_VERSION}`,
        request.tee,
      );
    const verifier = this.opts.verifiers.get(request.tee as VerifiedTee);
    if (verifier === undefined)
      return this.authRefused(
        401,
        'attestation',
        `tee ${request.tee} has no verifier in this broker (it verifies: ${[...this.opts.verifiers.keys()].join(', ') || 'none'})`,
        request.tee,
      );
    const nonce = freshNonce();
    let challenge: ReturnType<typeof verifier.challenge>;
    try {
      challenge = verifier.challenge(request['extra-params'], nonce);
    } catch (err) {
      // A verifier refuses what it judged (an EK certificate no trusted CA issued) with
      // ATTEST_EVIDENCE_REFUSED: trustee's 401. Anything else it threw as invalid is malformed.
      if (isReason(err, 'ATTEST_EVIDENCE_REFUSED')) return this.authRefused(401, 'attestation', errorMessage(err), request.tee);
      if (isKataError(err) && err.kind === 'invalid') return this.authRefused(400, 'malformed', errorMessage(err), request.tee);
      throw err;
    }
    const session = this.opts.sessions.create(verifier.tee, nonce, challenge.sessionState);
    if (session === undefined)
      return this.authRefused(503, 'busy', 'the broker holds as many sessions as it may; try again later', request.tee);
    this.opts.log.record({ event: 'auth', outcome: 'granted', session: session.logId, tee: verifier.tee });
    return json(200, { nonce, 'extra-params': challenge.extraParams }, { 'set-cookie': sessionCookieHeader(session, this.now()) });
  }

  private authRefused(status: number, type: KbsErrorType, detail: string, tee?: string): BrokerResponse {
    this.opts.log.record({ event: 'auth', outcome: 'refused', status, ...(tee === undefined ? {} : { tee }), reason: detail });
    return refuse(status, type, detail);
  }

  /** The session of a request's cookie, or the refusal. */
  private sessionOf(req: BrokerRequest, event: 'attest' | 'resource'): { session: Session } | { refusal: BrokerResponse } {
    const id = sessionIdOfCookie(req.cookie);
    const refused = (detail: string) => {
      this.opts.log.record({ event, outcome: 'refused', status: 401, reason: detail });
      return { refusal: refuse(401, event === 'attest' ? 'attestation' : 'tokenNotFound', detail) };
    };
    if (id === undefined) return refused('no kbs-session-id cookie: start at /kbs/v0/auth');
    const found = this.opts.sessions.lookup(id);
    if (!found.ok)
      return refused(
        found.why === 'expired' ? 'the session has expired: start again at /kbs/v0/auth' : 'unknown session: start at /kbs/v0/auth',
      );
    return { session: found.session };
  }

  private async attest(req: BrokerRequest): Promise<BrokerResponse> {
    const got = this.sessionOf(req, 'attest');
    if ('refusal' in got) return got.refusal;
    const session = got.session;
    const refused = (status: number, type: KbsErrorType, detail: string, extra: Record<string, unknown> = {}) => {
      this.opts.log.record({
        event: 'attest',
        outcome: 'refused',
        status,
        session: session.logId,
        tee: session.tee,
        reason: detail,
        ...extra,
      });
      return refuse(status, type, detail);
    };
    if (session.attested !== null) return refused(401, 'attestation', 'this session has attested already: start again at /kbs/v0/auth');
    const parsed = parseJson(req.body);
    if (!parsed.ok) return refused(400, 'malformed', `Attestation is not JSON: ${parsed.why}`);
    let attestation: ReturnType<typeof decodeAttestation>;
    try {
      attestation = decodeAttestation(parsed.doc);
    } catch (err) {
      return refused(400, 'malformed', errorMessage(err));
    }
    // The nonce answers one Attestation that decodes, granted or not: evidence is judged once.
    const use = this.opts.sessions.takeNonce(session);
    if (!use.ok)
      return refused(
        401,
        'attestation',
        use.why === 'used'
          ? 'the nonce of this session was used already: start again at /kbs/v0/auth'
          : 'the nonce has expired: start again at /kbs/v0/auth',
      );
    const runtimeData = attestation['runtime-data'];
    if (runtimeData.nonce !== use.nonce) {
      const failures: AttestFailure[] = [{ field: 'nonce', reason: 'runtime-data.nonce is not the nonce of this session' }];
      return refused(401, 'attestation', `evidence refused: ${describeFailures(failures)}`, { failures });
    }
    const verifier = this.opts.verifiers.get(session.tee);
    if (verifier === undefined) return refused(401, 'attestation', `tee ${session.tee} has no verifier in this broker any more`);
    const initdata = attestation['init-data'];
    let result: VerifyResult;
    try {
      result = verifier.verify({
        nonce: use.nonce,
        runtimeDataBytes: runtimeDataBytes(runtimeData),
        initdataBody: initdata === undefined ? null : Buffer.from(initdata.body, 'utf8'),
        evidence: attestation['tee-evidence'].primary_evidence,
        sessionState: session.verifierState,
        nowMs: this.now(),
      });
    } catch (err) {
      // A verifier throws a coded error on evidence it cannot decode: that is a refusal of the
      // evidence, not a failure of the broker.
      if (
        isReason(
          err,
          'ATTEST_EVIDENCE_INVALID',
          'ATTEST_MESSAGE_INVALID',
          'ATTEST_EVENT_LOG_INVALID',
          'ATTEST_CREDENTIAL_INVALID',
          'ATTEST_EVIDENCE_REFUSED',
        )
      ) {
        const field = typeof err.details?.field === 'string' ? err.details.field : 'tee-evidence';
        const failures: AttestFailure[] = [{ field, reason: err.message }];
        return refused(401, 'attestation', `evidence refused: ${describeFailures(failures)}`, { failures });
      }
      throw err;
    }
    if (!result.ok)
      return refused(401, 'attestation', `evidence refused: ${describeFailures(result.failures)}`, { failures: result.failures });
    const claims = result.claims;
    const digest = claimsDigest(claims);
    const appraisal = appraise(claims, this.opts.config.references);
    if (appraisal.matched.length === 0) {
      const detail =
        Object.keys(appraisal.mismatches).length === 0
          ? 'the evidence verified but the broker holds no reference set'
          : `the evidence verified but matched no reference set: ${Object.entries(appraisal.mismatches)
              .map(([name, f]) => `${name}: ${describeFailures(f)}`)
              .join(' | ')}`;
      return refused(401, 'attestation', detail, { claims: claims.measurements, claimsDigest: digest, mismatches: appraisal.mismatches });
    }
    const teePubkey = runtimeData['tee-pubkey'];
    const token = await this.opts.signer.sign(
      { tee: claims.tee, matched: appraisal.matched, claims_digest: digest, 'tee-pubkey': teePubkey },
      this.now(),
      session.expiresAtMs,
    );
    session.attested = { matched: appraisal.matched, teePubkey, claims, claimsDigest: digest };
    this.opts.log.record({
      event: 'attest',
      outcome: 'granted',
      session: session.logId,
      tee: claims.tee,
      matched: appraisal.matched,
      claims: claims.measurements,
      details: claims.details,
      claimsDigest: digest,
      mismatches: appraisal.mismatches,
    });
    return json(200, { token });
  }

  private async resource(req: BrokerRequest, rawPath: string): Promise<BrokerResponse> {
    let resourcePath: string;
    try {
      resourcePath = formatResourcePath(parseResourcePath(rawPath));
    } catch (err) {
      const detail = errorMessage(err);
      this.opts.log.record({ event: 'resource', outcome: 'refused', status: 404, path: rawPath.slice(0, 200), reason: detail });
      return refuse(404, 'invalidRequestPath', detail);
    }
    const got = this.sessionOf(req, 'resource');
    if ('refusal' in got) return got.refusal;
    const session = got.session;
    const refused = (status: number, type: KbsErrorType, detail: string) => {
      this.opts.log.record({ event: 'resource', outcome: 'refused', status, session: session.logId, path: resourcePath, reason: detail });
      return refuse(status, type, detail);
    };
    if (session.attested === null) return refused(401, 'tokenNotFound', 'this session has not attested: POST /kbs/v0/attest first');
    const decision = decideResource(this.opts.config.policy, resourcePath, session.attested.matched);
    if (!decision.allowed) return refused(403, 'policyDeny', decision.detail);
    const data = await this.opts.config.readResource(resourcePath);
    if (data === undefined) return refused(404, 'resourceNotFound', `no resource ${resourcePath}`);
    let jwe: Awaited<ReturnType<typeof encryptResource>>;
    try {
      jwe = await encryptResource(data, session.attested.teePubkey);
    } catch (err) {
      return refused(500, 'jwe', `the resource could not be encrypted to the session's key: ${errorMessage(err)}`);
    }
    this.opts.log.record({
      event: 'resource',
      outcome: 'released',
      session: session.logId,
      path: resourcePath,
      allowedBy: decision.by,
      matched: session.attested.matched,
      bytes: data.byteLength,
    });
    return json(200, jwe);
  }
}
