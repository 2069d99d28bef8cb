import { describe, expect, it } from 'vitest';
import { freshNonce, SessionTable, sessionCookieHeader, sessionIdOfCookie, sessionLogId } from '../../../src/broker/sessions.js';
import { Clock } from './fixtures.js';

const limits = { sessionTtlMs: 10_000, nonceTtlMs: 4_000, maxSessions: 3 };

describe('sessions', () => {
  it('a nonce is 32 fresh random bytes, base64', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 64; i++) {
      const n = freshNonce();
      expect(n).toHaveLength(44);
      expect(Buffer.from(n, 'base64')).toHaveLength(32);
      seen.add(n);
    }
    expect(seen.size).toBe(64);
  });

  it('a nonce is taken once; the second take says used', () => {
    const clock = new Clock();
    const table = new SessionTable(limits, clock.now);
    const s = table.create('tpm', 'n1', null);
    expect(s).toBeDefined();
    expect(table.takeNonce(s!)).toEqual({ ok: true, nonce: 'n1' });
    expect(table.takeNonce(s!)).toEqual({ ok: false, why: 'used' });
  });

  it('a nonce expires before its session; taking an expired one uses it up', () => {
    const clock = new Clock();
    const table = new SessionTable(limits, clock.now);
    const s = table.create('tpm', 'n1', null)!;
    clock.advance(3_999);
    expect(table.lookup(s.id).ok).toBe(true);
    const t = table.create('tpm', 'n2', null)!;
    clock.advance(4_000);
    expect(table.takeNonce(t)).toEqual({ ok: false, why: 'expired' });
    expect(table.takeNonce(t)).toEqual({ ok: false, why: 'used' });
    expect(table.takeNonce(s)).toEqual({ ok: false, why: 'expired' });
  });

  it('a session expires at its ttl and is dropped; unknown ids say unknown', () => {
    const clock = new Clock();
    const table = new SessionTable(limits, clock.now);
    const s = table.create('tpm', 'n', null)!;
    clock.advance(9_999);
    expect(table.lookup(s.id)).toMatchObject({ ok: true });
    clock.advance(1);
    expect(table.lookup(s.id)).toEqual({ ok: false, why: 'expired' });
    expect(table.lookup(s.id)).toEqual({ ok: false, why: 'unknown' });
    expect(table.size).toBe(0);
  });

  it('is bounded: a full table of live sessions refuses, expired ones are swept to make room', () => {
    const clock = new Clock();
    const table = new SessionTable(limits, clock.now);
    for (let i = 0; i < 3; i++) expect(table.create('tpm', `n${i}`, null)).toBeDefined();
    expect(table.create('tpm', 'n4', null)).toBeUndefined();
    clock.advance(10_000);
    expect(table.create('tpm', 'n5', null)).toBeDefined();
    expect(table.size).toBe(1);
  });

  it('session ids are 32 random bytes, base64url; the log id is a digest prefix, not the id', () => {
    const table = new SessionTable(limits);
    const s = table.create('tpm', 'n', null)!;
    expect(s.id).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(s.logId).toBe(sessionLogId(s.id));
    expect(s.logId).toMatch(/^[0-9a-f]{16}$/);
    expect(s.id).not.toContain(s.logId);
  });

  it('reads exactly one well-formed kbs-session-id from a Cookie header', () => {
    expect(sessionIdOfCookie('kbs-session-id=abc_-1')).toBe('abc_-1');
    expect(sessionIdOfCookie('a=1; kbs-session-id=abc; b=2')).toBe('abc');
    for (const bad of [
      undefined,
      '',
      'kbs-session-id=',
      'kbs-session-id=a b',
      'kbs-session-id=a;kbs-session-id=b',
      'x-kbs-session-id=a',
      `kbs-session-id=${'a'.repeat(129)}`,
    ])
      expect(sessionIdOfCookie(bad)).toBeUndefined();
  });

  it('sets the cookie Secure, HttpOnly, for /kbs/v0, with the remaining life as Max-Age', () => {
    const clock = new Clock();
    const table = new SessionTable(limits, clock.now);
    const s = table.create('tpm', 'n', null)!;
    expect(sessionCookieHeader(s, clock.t + 2_500)).toBe(
      `kbs-session-id=${s.id}; Max-Age=7; Path=/kbs/v0; Secure; HttpOnly; SameSite=Strict`,
    );
  });
});
