/**
 * Single-use, short-lived tokens for streaming URLs, as the kubelet's streaming server keeps
 * them: random (16 bytes, URL-safe), consumed on first use, expired after `ttlMs` (one minute by
 * default), at most `maxInFlight` outstanding (a full store refuses new ones rather than evicting).
 */
import { randomBytes } from 'node:crypto';
import { exhausted } from '../../common/errors.js';

export interface TokenStoreOptions {
  ttlMs: number;
  maxInFlight: number;
  /** The clock, for tests. */
  nowMs?: () => number;
}

export class TokenStore<T> {
  private readonly entries = new Map<string, { value: T; expiresAtMs: number }>();
  private readonly now: () => number;

  constructor(private readonly options: TokenStoreOptions) {
    this.now = options.nowMs ?? Date.now;
  }

  /** A new token for `value`; RESOURCE_EXHAUSTED when `maxInFlight` unexpired tokens exist. */
  issue(value: T): string {
    this.prune();
    if (this.entries.size >= this.options.maxInFlight) {
      throw exhausted('STREAM_TOKENS_EXHAUSTED', `${this.options.maxInFlight} streaming requests are in flight already; try again later.`);
    }
    let token: string;
    do token = randomBytes(16).toString('base64url');
    while (this.entries.has(token));
    this.entries.set(token, { value, expiresAtMs: this.now() + this.options.ttlMs });
    return token;
  }

  /** The value of an unexpired token, which is forgotten at once (a token works once). */
  consume(token: string): T | undefined {
    const entry = this.entries.get(token);
    if (entry === undefined) return undefined;
    this.entries.delete(token);
    return entry.expiresAtMs > this.now() ? entry.value : undefined;
  }

  /** Unexpired tokens outstanding. */
  get size(): number {
    this.prune();
    return this.entries.size;
  }

  private prune(): void {
    const now = this.now();
    for (const [token, entry] of this.entries) if (entry.expiresAtMs <= now) this.entries.delete(token);
  }
}
