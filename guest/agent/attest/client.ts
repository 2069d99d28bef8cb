/**
 * The guest's side of trustee's KBS protocol (RCAR, docs/attestation.md): Request at
 * `/kbs/v0/auth`, evidence for the Challenge at `/kbs/v0/attest`, resources at
 * `/kbs/v0/resource/...` with the session cookie, decrypted with a key pair made here for each
 * attestation. The private key exists only in this object; a resource's bytes only in what
 * `resource` returns (never logged: lengths only).
 *
 * States: `idle` (configured, not attested), `attesting`, `attested` (a session the broker
 * accepted), `failed` (the last attestation did not end in a session: the error says why). One
 * attestation runs at a time; every caller waiting for one shares it. While the broker cannot be
 * reached (the pod's network may come up after the agent), attempts repeat with a doubling delay
 * within a time budget; a refusal is not retried within a call (the evidence will not change by
 * itself), but the next `resource` call attests afresh (the broker's policy may have). A resource
 * answered 401 means the session is gone (expired, or the broker restarted): the client attests
 * once more and asks again.
 */
import type { KeyObject } from 'node:crypto';
import { decryptResource, generateTeeKeyPair } from '../../../src/attest/jwe.js';
import {
  decodeAttestationToken,
  decodeChallenge,
  decodeErrorInformation,
  KBS_PROTOCOL_VERSION,
  type KbsAttestation,
  type KbsErrorInformation,
  type KbsRuntimeData,
  runtimeDataBytes,
} from '../../../src/attest/kbs-protocol.js';
import {
  formatResourcePath,
  parseResourcePath,
  parseResourceUri,
  type ResourcePath,
  resourceUrlPath,
} from '../../../src/attest/resource-path.js';
import { isKataError, type KataError, notFound, unauthenticated, unavailable } from '../../../src/common/errors.js';
import type { Logger } from '../../../src/common/logger.js';
import type { BrokerConfig } from './config.js';
import type { EvidenceSource } from './evidence.js';
import { type BrokerHttpRequest, type BrokerHttpResponse, type BrokerTransport, isRetryable } from './http.js';
import './reasons.js';

export type AttestClientState = 'idle' | 'attesting' | 'attested' | 'failed';

/** How long and how often to try while the broker is unreachable. */
export interface RetryPolicy {
  firstDelayMs: number;
  maxDelayMs: number;
  /** Give up once this much time has passed since the first attempt of a call. */
  budgetMs: number;
}

/** First retry after 0.5 s, doubling to 15 s, for 5 minutes: a pod network is up well within it. */
export const DEFAULT_RETRY: RetryPolicy = { firstDelayMs: 500, maxDelayMs: 15_000, budgetMs: 5 * 60_000 };

export interface AttestClientOptions {
  broker: BrokerConfig;
  transport: BrokerTransport;
  evidence: EvidenceSource;
  /** The initdata document's text, sent as `init-data` {format: "toml"} (the evidence binds its digest). */
  initdataBody: string;
  log: Logger;
  now: () => number;
  sleep?: (ms: number) => Promise<void>;
  retry?: RetryPolicy;
  /** The tee-pubkey's kind: EC P-256 (ECDH-ES+A256KW, the default) or RSA (RSA-OAEP-256). */
  keyKind?: 'EC-P256' | 'RSA';
}

/** A session the broker accepted. */
interface Session {
  id: string;
  privateKey: KeyObject;
  /** The reference sets the broker's token says the evidence matched (read, not verified: for status only). */
  matched: string[] | undefined;
  attestedAtMs: number;
}

/** What `status` reports (no secret, no key). */
export interface AttestClientStatus {
  state: AttestClientState;
  /** The error of the last attestation or resource that failed, reason and message. */
  lastError: { reason: string; message: string } | null;
  matched?: string[];
  attestedAtMs?: number;
}

const MAX_ERROR_DETAIL_CHARS = 512;

/** Where a resource name came from: a `kbs:///r/t/tag` URI or a bare `r/t/tag` path. */
export function parseResourceName(name: string): ResourcePath {
  return name.startsWith('kbs://') ? parseResourceUri(name, 'resource').path : parseResourcePath(name, 'resource');
}

/** The payload of a JWT, decoded without verification (the status shows what the broker said). */
function jwtMatched(token: string): string[] | undefined {
  try {
    const payload = JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString('utf8')) as { matched?: unknown };
    return Array.isArray(payload.matched) && payload.matched.every((m) => typeof m === 'string') ? payload.matched.slice(0, 64) : undefined;
  } catch {
    return undefined;
  }
}

/** The broker's ErrorInformation detail from a refusal body, or a description of what came instead. */
export function refusalDetail(res: BrokerHttpResponse): { type?: string; detail: string } {
  let info: KbsErrorInformation;
  try {
    info = decodeErrorInformation(JSON.parse(res.body.toString('utf8')));
  } catch {
    return { detail: `HTTP ${res.status} without an ErrorInformation body (${res.body.length} bytes)` };
  }
  const detail = info.detail.length > MAX_ERROR_DETAIL_CHARS ? `${info.detail.slice(0, MAX_ERROR_DETAIL_CHARS)}...` : info.detail;
  return { type: info.type, detail };
}

function parseJson(res: BrokerHttpResponse, what: string): unknown {
  try {
    return JSON.parse(res.body.toString('utf8'));
  } catch (err) {
    throw unavailable('ATTEST_BROKER_PROTOCOL', `the broker's ${what} is not JSON`, { cause: err });
  }
}

const defaultSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

export class AttestClient {
  private state: AttestClientState = 'idle';
  private session: Session | null = null;
  private inFlight: Promise<Session> | null = null;
  private lastError: { reason: string; message: string } | null = null;
  private readonly retry: RetryPolicy;
  private readonly sleep: (ms: number) => Promise<void>;
  /** Retries waiting for their backoff, woken early by `nudge`. */
  private readonly waiting = new Set<() => void>();

  constructor(private readonly o: AttestClientOptions) {
    this.retry = o.retry ?? DEFAULT_RETRY;
    this.sleep = o.sleep ?? defaultSleep;
  }

  status(): AttestClientStatus {
    return {
      state: this.state,
      lastError: this.lastError,
      ...(this.session?.matched === undefined ? {} : { matched: this.session.matched }),
      ...(this.session === null ? {} : { attestedAtMs: this.session.attestedAtMs }),
    };
  }

  /**
   * Something that may make the broker reachable happened (the pod network came up, a container
   * waits for a resource): a retry waiting for its backoff is made now, its backoff starting over.
   */
  nudge(): void {
    for (const wake of this.waiting) wake();
    this.waiting.clear();
  }

  /** Attests unless a session is live; callers during an attestation share it. */
  attest(): Promise<void> {
    return this.ensureSession().then(() => undefined);
  }

  /**
   * The resource `name` (`kbs:///repo/type/tag` or `repo/type/tag`), decrypted, in memory.
   * Throws ATTEST_RESOURCE_PATH_INVALID for a bad name, ATTEST_RESOURCE_REFUSED naming the
   * resource with the broker's detail, or the attestation's own error.
   */
  async resource(name: string): Promise<Buffer> {
    const path = parseResourceName(name);
    const shown = formatResourcePath(path);
    // A container now waits on the broker: an attestation at start still backing off retries now.
    this.nudge();
    try {
      let session = await this.ensureSession();
      let res = await this.exchange({ method: 'GET', path: resourceUrlPath(path), sessionId: session.id });
      if (res.status === 401) {
        // The session is gone (expired, or the broker restarted): attest once more, ask again.
        this.o.log.info({ resource: shown }, 'the broker no longer knows the session: attesting again');
        this.dropSession(session);
        session = await this.ensureSession();
        res = await this.exchange({ method: 'GET', path: resourceUrlPath(path), sessionId: session.id });
      }
      if (res.status !== 200) {
        const { type, detail } = refusalDetail(res);
        const make = res.status === 404 ? notFound : unauthenticated;
        throw make('ATTEST_RESOURCE_REFUSED', `the broker refused resource ${shown}: ${detail}`, {
          details: { resource: shown, status: res.status, ...(type === undefined ? {} : { type }), detail },
        });
      }
      const plaintext = Buffer.from(await decryptResource(parseJson(res, 'resource'), session.privateKey));
      this.o.log.info({ resource: shown, bytes: plaintext.length }, 'resource received');
      return plaintext;
    } catch (err) {
      this.noteError(err);
      throw err;
    }
  }

  private noteError(err: unknown): void {
    this.lastError = isKataError(err)
      ? { reason: err.reason, message: err.message }
      : { reason: 'INTERNAL', message: err instanceof Error ? err.message : String(err) };
  }

  private dropSession(session: Session): void {
    if (this.session === session) {
      this.session = null;
      this.state = 'idle';
    }
  }

  private ensureSession(): Promise<Session> {
    if (this.session !== null) return Promise.resolve(this.session);
    if (this.inFlight === null) {
      this.state = 'attesting';
      this.inFlight = this.attestOnce()
        .then(
          (session) => {
            this.session = session;
            this.state = 'attested';
            this.lastError = null;
            return session;
          },
          (err: unknown) => {
            this.state = 'failed';
            this.noteError(err);
            throw err;
          },
        )
        .finally(() => {
          this.inFlight = null;
        });
    }
    return this.inFlight;
  }

  /** One request, repeated while the broker is unreachable or answers 5xx, within the budget. */
  private async exchange(req: BrokerHttpRequest): Promise<BrokerHttpResponse> {
    const start = this.o.now();
    let delay = this.retry.firstDelayMs;
    for (let attempt = 1; ; attempt++) {
      let retryable: unknown;
      try {
        const res = await this.o.transport(req);
        if (res.status < 500) return res;
        retryable = unavailable(
          'ATTEST_BROKER_UNREACHABLE',
          `broker ${this.o.broker.url}: ${req.path} answered ${res.status}: ${refusalDetail(res).detail}`,
        );
      } catch (err) {
        if (!isRetryable(err)) throw err;
        retryable = err;
      }
      const elapsed = this.o.now() - start;
      if (elapsed + delay > this.retry.budgetMs) {
        const message = retryable instanceof Error ? retryable.message : String(retryable);
        throw unavailable(
          'ATTEST_BROKER_UNREACHABLE',
          `broker ${this.o.broker.url} not reached in ${attempt} attempts over ${elapsed} ms: ${message}`,
          {
            cause: retryable,
            details: { attempts: attempt, elapsedMs: elapsed },
          },
        );
      }
      this.o.log.info(
        { attempt, delayMs: delay, err: retryable instanceof Error ? retryable.message : String(retryable) },
        'broker not reached yet: retrying',
      );
      let wake = (): void => undefined;
      const woken = new Promise<boolean>((resolve) => {
        wake = () => resolve(true);
        this.waiting.add(wake);
      });
      const early = await Promise.race([this.sleep(delay).then(() => false), woken]);
      this.waiting.delete(wake);
      delay = early ? this.retry.firstDelayMs : Math.min(delay * 2, this.retry.maxDelayMs);
    }
  }

  /** Request, Challenge, evidence, token: one session. */
  private async attestOnce(): Promise<Session> {
    const round = await this.o.evidence.begin().catch((err: unknown) => {
      throw wrapEvidence(err);
    });
    try {
      const auth = await this.exchange({
        method: 'POST',
        path: '/kbs/v0/auth',
        body: { version: KBS_PROTOCOL_VERSION, tee: this.o.evidence.tee, 'extra-params': round.requestExtraParams },
      });
      if (auth.status !== 200) throw refused(auth, 'Request');
      const challenge = decodeChallenge(parseJson(auth, 'Challenge'));
      const sessionId = auth.setSessionId;
      if (sessionId === undefined)
        throw unavailable('ATTEST_BROKER_PROTOCOL', 'the broker answered the Request without a kbs-session-id cookie');

      // A new key for every session: resources of an older session cannot be read with it.
      const { publicJwk, privateKey } = await generateTeeKeyPair(this.o.keyKind ?? 'EC-P256');
      const runtimeData: KbsRuntimeData = { nonce: challenge.nonce, 'tee-pubkey': publicJwk };
      const primary = await round.evidence(challenge['extra-params'], runtimeDataBytes(runtimeData)).catch((err: unknown) => {
        throw wrapEvidence(err);
      });
      const attestation: KbsAttestation = {
        'init-data': { format: 'toml', body: this.o.initdataBody },
        'runtime-data': runtimeData,
        'tee-evidence': { primary_evidence: primary, additional_evidence: '' },
      };
      const answer = await this.exchange({ method: 'POST', path: '/kbs/v0/attest', body: attestation, sessionId });
      if (answer.status !== 200) throw refused(answer, 'evidence');
      const { token } = decodeAttestationToken(parseJson(answer, 'AttestationToken'));
      const matched = jwtMatched(token);
      this.o.log.info({ broker: this.o.broker.url, matched }, 'attested');
      return { id: answer.setSessionId ?? sessionId, privateKey, matched, attestedAtMs: this.o.now() };
    } finally {
      await round.end().catch((err: unknown) => this.o.log.warn({ err: (err as Error).message }, 'the evidence source did not close'));
    }
  }
}

function refused(res: BrokerHttpResponse, what: string): KataError {
  const { type, detail } = refusalDetail(res);
  return unauthenticated('ATTEST_REFUSED', `the broker refused the ${what}: ${detail}`, {
    details: { status: res.status, ...(type === undefined ? {} : { type }), detail },
  });
}

function wrapEvidence(err: unknown): KataError {
  if (isKataError(err) && err.reason === 'ATTEST_EVIDENCE_FAILED') return err;
  return unavailable('ATTEST_EVIDENCE_FAILED', `the TEE could not produce evidence: ${err instanceof Error ? err.message : String(err)}`, {
    cause: err,
  });
}
