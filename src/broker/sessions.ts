/**
 * The broker's sessions: one per `/kbs/v0/auth`, named by the `kbs-session-id` cookie (32 random
 * bytes), holding the challenge nonce until it is used once or expires, and after a granted
 * attestation the reference sets matched and the key resources are encrypted to. Bounded in
 * number and in time; the clock is a parameter so expiry is tested without waiting.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { TeePubkey } from '../attest/kbs-protocol.js';
import type { AttestClaims, VerifiedTee } from '../attest/verifier.js';

/** The cookie trustee's protocol names. */
export const SESSION_COOKIE = 'kbs-session-id';

export interface SessionLimits {
  /** A session's life from `/kbs/v0/auth` (trustee's default is 5 minutes). */
  sessionTtlMs: number;
  /** How long a nonce may be answered; shorter than the session. */
  nonceTtlMs: number;
  /** Live sessions at most; a full table refuses new ones until some expire. */
  maxSessions: number;
}

export const DEFAULT_SESSION_LIMITS: SessionLimits = { sessionTtlMs: 300_000, nonceTtlMs: 120_000, maxSessions: 1024 };

export interface SessionAttested {
  matched: string[];
  teePubkey: TeePubkey;
  claims: AttestClaims;
  claimsDigest: string;
}

export interface Session {
  id: string;
  /** sha256(id) cut to 16 hex digits: names the session in logs without being the cookie. */
  logId: string;
  tee: VerifiedTee;
  createdAtMs: number;
  expiresAtMs: number;
  /** The challenge nonce; null once an Attestation used it. */
  nonce: string | null;
  nonceExpiresAtMs: number;
  /** The verifier's state from `challenge`, for `verify`. */
  verifierState: unknown;
  attested: SessionAttested | null;
}

export type SessionLookup = { ok: true; session: Session } | { ok: false; why: 'unknown' | 'expired' };
export type NonceUse = { ok: true; nonce: string } | { ok: false; why: 'used' | 'expired' };

/** Pure: the log name of a session id. */
export function sessionLogId(id: string): string {
  return createHash('sha256').update(id).digest('hex').slice(0, 16);
}

/** A fresh challenge nonce: 32 random bytes, base64 (44 characters, as trustee's). */
export function freshNonce(): string {
  return randomBytes(32).toString('base64');
}

export class SessionTable {
  private readonly sessions = new Map<string, Session>();

  constructor(
    readonly limits: SessionLimits,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.sessions.size;
  }

  /** Drops expired sessions. */
  sweep(): void {
    const t = this.now();
    for (const [id, s] of this.sessions) if (s.expiresAtMs <= t) this.sessions.delete(id);
  }

  /** A new session with its nonce; undefined when the table is full of live sessions. */
  create(tee: VerifiedTee, nonce: string, verifierState: unknown): Session | undefined {
    if (this.sessions.size >= this.limits.maxSessions) this.sweep();
    if (this.sessions.size >= this.limits.maxSessions) return undefined;
    const t = this.now();
    const id = randomBytes(32).toString('base64url');
    const session: Session = {
      id,
      logId: sessionLogId(id),
      tee,
      createdAtMs: t,
      expiresAtMs: t + this.limits.sessionTtlMs,
      nonce,
      nonceExpiresAtMs: t + Math.min(this.limits.nonceTtlMs, this.limits.sessionTtlMs),
      verifierState,
      attested: null,
    };
    this.sessions.set(id, session);
    return session;
  }

  /** The live session of a cookie value; an expired one is dropped and said so. */
  lookup(id: string): SessionLookup {
    const s = this.sessions.get(id);
    if (s === undefined) return { ok: false, why: 'unknown' };
    if (s.expiresAtMs <= this.now()) {
      this.sessions.delete(id);
      return { ok: false, why: 'expired' };
    }
    return { ok: true, session: s };
  }

  /** Takes the session's nonce: it answers one Attestation only, and only before it expires. */
  takeNonce(session: Session): NonceUse {
    const nonce = session.nonce;
    if (nonce === null) return { ok: false, why: 'used' };
    session.nonce = null;
    if (session.nonceExpiresAtMs <= this.now()) return { ok: false, why: 'expired' };
    return { ok: true, nonce };
  }
}

/** Pure: the `kbs-session-id` value of a Cookie header, if exactly one is there and well formed. */
export function sessionIdOfCookie(header: string | undefined): string | undefined {
  if (header === undefined || header.length > 8192) return undefined;
  const values = header
    .split(';')
    .map((p) => p.trim())
    .filter((p) => p.startsWith(`${SESSION_COOKIE}=`))
    .map((p) => p.slice(SESSION_COOKIE.length + 1));
  if (values.length !== 1) return undefined;
  const v = values[0] as string;
  return /^[A-Za-z0-9_-]{1,128}$/.test(v) ? v : undefined;
}

/** Pure: the Set-Cookie header of a session. */
export function sessionCookieHeader(session: Session, nowMs: number): string {
  const maxAge = Math.max(0, Math.floor((session.expiresAtMs - nowMs) / 1000));
  return `${SESSION_COOKIE}=${session.id}; Max-Age=${maxAge}; Path=/kbs/v0; Secure; HttpOnly; SameSite=Strict`;
}
