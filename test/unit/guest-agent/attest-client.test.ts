/**
 * The attester's protocol state machine (guest/agent/attest/client.ts) against a scripted broker:
 * the transport seam answers as `kata-ts broker` does, resources are real JWEs encrypted to the
 * tee-pubkey the client sent (src/attest/jwe.ts), the clock and the sleeps are virtual. The
 * evidence source here is a stand-in that binds the runtime data bytes it is given; the real TPM
 * evidence against a real broker is test/integration/attest/attester.test.ts.
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { AttestClient, type AttestClientOptions } from '../../../guest/agent/attest/client.js';
import type { EvidenceSource } from '../../../guest/agent/attest/evidence.js';
import type { BrokerHttpRequest, BrokerHttpResponse } from '../../../guest/agent/attest/http.js';
import { encryptResource } from '../../../src/attest/jwe.js';
import { type KbsAttestation, runtimeDataBytes, type TeePubkey } from '../../../src/attest/kbs-protocol.js';
import { unavailable } from '../../../src/common/errors.js';
import { rejection } from '../../helpers/kata-error.js';

const SECRET = Buffer.from('the-one-secret-value-0123456789');
const json = (status: number, body: unknown, setSessionId?: string): BrokerHttpResponse => ({
  status,
  contentType: 'application/json',
  setSessionId,
  body: Buffer.from(JSON.stringify(body)),
});
const errorInfo = (status: number, type: string, detail: string) =>
  json(status, { type: `https://github.com/confidential-containers/kbs/errors/${type}`, detail });
const unreachable = () =>
  unavailable('ATTEST_BROKER_UNREACHABLE', 'connect ECONNREFUSED 127.0.0.1:1', { details: { retryable: true, code: 'ECONNREFUSED' } });

/** A broker as a function of the request, keeping its sessions; hooks override single answers. */
class ScriptedBroker {
  readonly calls: BrokerHttpRequest[] = [];
  readonly sessions = new Map<string, { nonce: string; key?: TeePubkey }>();
  private n = 0;
  /** Answers taken first, one per request, before the broker's own logic (undefined: fall through). */
  readonly script: Array<((req: BrokerHttpRequest) => Promise<BrokerHttpResponse> | BrokerHttpResponse) | undefined> = [];
  resources = new Map<string, Buffer>([['default/key/one', SECRET]]);
  denied = new Set<string>(['default/key/denied']);

  readonly transport = async (req: BrokerHttpRequest): Promise<BrokerHttpResponse> => {
    this.calls.push(req);
    const scripted = this.script.shift();
    if (scripted !== undefined) return scripted(req);
    if (req.method === 'POST' && req.path === '/kbs/v0/auth') {
      const id = `s${++this.n}`;
      const nonce = Buffer.from(`nonce-${this.n}`).toString('base64');
      this.sessions.set(id, { nonce });
      return json(200, { nonce, 'extra-params': { challenge: this.n } }, id);
    }
    const session = req.sessionId === undefined ? undefined : this.sessions.get(req.sessionId);
    if (req.method === 'POST' && req.path === '/kbs/v0/attest') {
      if (session === undefined) return errorInfo(401, 'AttestationError', 'no such session');
      const a = req.body as KbsAttestation;
      const bound = (a['tee-evidence'].primary_evidence as { bound: string }).bound;
      if (a['runtime-data'].nonce !== session.nonce) return errorInfo(401, 'AttestationError', 'nonce differs');
      if (bound !== runtimeDataBytes(a['runtime-data']).toString('base64'))
        return errorInfo(401, 'AttestationError', 'the evidence is not bound to the runtime data');
      if (a['init-data']?.format !== 'toml' || a['init-data'].body !== 'version = "0.1.0"')
        return errorInfo(401, 'AttestationError', 'init-data missing');
      session.key = a['runtime-data']['tee-pubkey'];
      const payload = Buffer.from(JSON.stringify({ matched: ['lab'] })).toString('base64url');
      return json(200, { token: `eyJhbGciOiJFUzI1NiJ9.${payload}.sig` });
    }
    if (req.method === 'GET' && req.path.startsWith('/kbs/v0/resource/')) {
      if (session?.key === undefined) return errorInfo(401, 'TokenNotFound', 'the session has not attested');
      const name = req.path.slice('/kbs/v0/resource/'.length);
      if (this.denied.has(name)) return errorInfo(403, 'PolicyDeny', `${name} is allowed to [prod]; this session matched [lab]`);
      const value = this.resources.get(name);
      if (value === undefined) return errorInfo(404, 'ResourceNotFound', `no resource ${name}`);
      return json(200, await encryptResource(value, session.key));
    }
    return errorInfo(404, 'NotFound', 'no such endpoint');
  };

  count(path: string): number {
    return this.calls.filter((c) => c.path === path).length;
  }
}

/** An evidence source that binds the runtime data bytes (the scripted broker checks it) and counts rounds. */
function evidence(): EvidenceSource & { rounds: number; ended: number; challenges: unknown[] } {
  const e = {
    tee: 'tpm' as const,
    rounds: 0,
    ended: 0,
    challenges: [] as unknown[],
    async begin() {
      e.rounds++;
      return {
        requestExtraParams: { ek_cert: 'pem', ak_public: 'ak' },
        evidence: async (challenge: unknown, rd: Buffer) => {
          e.challenges.push(challenge);
          return { bound: rd.toString('base64') };
        },
        end: async () => {
          e.ended++;
        },
      };
    },
  };
  return e;
}

/** A logger whose lines are kept, to check what is (not) logged. */
function capturingLogger() {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      lines.push(String(chunk));
      cb();
    },
  });
  return { log: pino({ level: 'trace' }, sink), lines };
}

function client(broker: ScriptedBroker, extra: Partial<AttestClientOptions> = {}) {
  let nowMs = 1_000_000;
  const sleeps: number[] = [];
  const ev = evidence();
  const { log, lines } = capturingLogger();
  const c = new AttestClient({
    broker: { url: 'https://broker.test', caPem: 'unused', source: 'test' },
    transport: broker.transport,
    evidence: ev,
    initdataBody: 'version = "0.1.0"',
    log,
    now: () => nowMs,
    sleep: async (ms) => {
      sleeps.push(ms);
      nowMs += ms;
    },
    retry: { firstDelayMs: 500, maxDelayMs: 4000, budgetMs: 20_000 },
    ...extra,
  });
  return { c, ev, sleeps, lines, advance: (ms: number) => (nowMs += ms) };
}

describe('the attester client', () => {
  it('runs RCAR: Request, Challenge, evidence bound to the runtime data, token, then a resource decrypted with its own key', async () => {
    const b = new ScriptedBroker();
    const { c, ev, lines } = client(b);
    expect(c.status().state).toBe('idle');
    const got = await c.resource('kbs:///default/key/one');
    expect(got.equals(SECRET)).toBe(true);
    expect(c.status()).toMatchObject({ state: 'attested', lastError: null, matched: ['lab'] });
    const auth = b.calls[0];
    expect(auth).toMatchObject({ method: 'POST', path: '/kbs/v0/auth', body: { version: '0.4.0', tee: 'tpm' } });
    expect(auth?.sessionId).toBeUndefined();
    expect(b.calls[1]).toMatchObject({ method: 'POST', path: '/kbs/v0/attest', sessionId: 's1' });
    const key = (b.calls[1]!.body as KbsAttestation)['runtime-data']['tee-pubkey'];
    expect(key).toMatchObject({ kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW' });
    expect(Object.keys(key)).not.toContain('d');
    expect(b.calls[2]).toMatchObject({ method: 'GET', path: '/kbs/v0/resource/default/key/one', sessionId: 's1' });
    expect(ev.challenges).toEqual([{ challenge: 1 }]);
    expect(ev.ended).toBe(1);
    // A second resource reuses the session.
    expect((await c.resource('default/key/one')).equals(SECRET)).toBe(true);
    expect(b.count('/kbs/v0/auth')).toBe(1);
    // The secret never reaches the log; its length does.
    const log = lines.join('');
    expect(log).not.toContain(SECRET.toString());
    expect(log).not.toContain(SECRET.toString('base64'));
    expect(log).toContain(`"bytes":${SECRET.length}`);
  });

  it('an RSA tee-pubkey works the same (RSA-OAEP-256)', async () => {
    const b = new ScriptedBroker();
    const { c } = client(b, { keyKind: 'RSA' });
    expect((await c.resource('default/key/one')).equals(SECRET)).toBe(true);
    expect((b.calls[1]!.body as KbsAttestation)['runtime-data']['tee-pubkey']).toMatchObject({ kty: 'RSA', alg: 'RSA-OAEP-256' });
  });

  it('callers during an attestation share it', async () => {
    const b = new ScriptedBroker();
    const { c, ev } = client(b);
    const all = await Promise.all([c.resource('default/key/one'), c.resource('default/key/one'), c.attest()]);
    expect(all[0]?.equals(SECRET)).toBe(true);
    expect(ev.rounds).toBe(1);
    expect(b.count('/kbs/v0/auth')).toBe(1);
  });

  it('retries with a doubling delay while the broker is unreachable, then attests', async () => {
    const b = new ScriptedBroker();
    b.script.push(
      () => Promise.reject(unreachable()),
      () => Promise.reject(unreachable()),
      () => errorInfo(503, 'TooManySessions', 'busy'),
      () => Promise.reject(unreachable()),
    );
    const { c, sleeps } = client(b);
    await c.attest();
    expect(sleeps).toEqual([500, 1000, 2000, 4000]);
    expect(c.status().state).toBe('attested');
  });

  it('a nudge (the pod network came up, a container waits) cuts a backoff short and starts it over', async () => {
    const b = new ScriptedBroker();
    b.script.push(
      () => Promise.reject(unreachable()),
      () => Promise.reject(unreachable()),
      () => Promise.reject(unreachable()),
    );
    // Sleeps that never end by themselves: only a nudge moves the client on.
    const sleeps: number[] = [];
    const { c } = client(b, {
      sleep: (ms) => {
        sleeps.push(ms);
        return new Promise<void>(() => undefined);
      },
    });
    const attested = c.attest();
    const waitForSleeps = async (n: number) => {
      for (let i = 0; i < 100 && sleeps.length < n; i++) await new Promise((r) => setImmediate(r));
      expect(sleeps).toHaveLength(n);
    };
    await waitForSleeps(1);
    c.nudge();
    await waitForSleeps(2);
    c.nudge();
    await waitForSleeps(3);
    // A resource request nudges too: the third backoff ends without an explicit nudge.
    const got = c.resource('default/key/one');
    await attested;
    expect((await got).equals(SECRET)).toBe(true);
    // Each backoff started over at the first delay instead of doubling.
    expect(sleeps).toEqual([500, 500, 500]);
    expect(b.count('/kbs/v0/auth')).toBe(4);
  });

  it('gives up when the budget is spent, saying how often it tried; the next call tries again', async () => {
    const b = new ScriptedBroker();
    for (let i = 0; i < 20; i++) b.script.push(() => Promise.reject(unreachable()));
    const { c, sleeps } = client(b);
    const e = await rejection(c.attest());
    expect(e.reason).toBe('ATTEST_BROKER_UNREACHABLE');
    expect(e.message).toMatch(/not reached in \d+ attempts/);
    expect(sleeps.reduce((a, s) => a + s, 0)).toBeLessThanOrEqual(20_000);
    expect(c.status()).toMatchObject({ state: 'failed', lastError: { reason: 'ATTEST_BROKER_UNREACHABLE' } });
    b.script.length = 0;
    expect((await c.resource('default/key/one')).equals(SECRET)).toBe(true);
    expect(c.status()).toMatchObject({ state: 'attested', lastError: null });
  });

  it('does not retry an error that will not pass (a TLS failure)', async () => {
    const b = new ScriptedBroker();
    b.script.push(() =>
      Promise.reject(
        unavailable('ATTEST_BROKER_UNREACHABLE', 'self-signed certificate', {
          details: { retryable: false, code: 'DEPTH_ZERO_SELF_SIGNED_CERT' },
        }),
      ),
    );
    const { c, sleeps, ev } = client(b);
    expect((await rejection(c.attest())).message).toContain('self-signed certificate');
    expect(sleeps).toEqual([]);
    expect(ev.ended).toBe(1);
  });

  it('refused evidence: ATTEST_REFUSED with the broker detail, not retried; status failed', async () => {
    const b = new ScriptedBroker();
    b.script.push(undefined, () => errorInfo(401, 'AttestationError', 'tpm_pcr8 differs from every reference set'));
    const { c, sleeps } = client(b);
    const e = await rejection(c.resource('default/key/one'));
    expect(e.reason).toBe('ATTEST_REFUSED');
    expect(e.message).toContain('tpm_pcr8 differs from every reference set');
    expect(e.details).toMatchObject({ status: 401, type: expect.stringContaining('AttestationError') });
    expect(sleeps).toEqual([]);
    expect(c.status()).toMatchObject({ state: 'failed', lastError: { reason: 'ATTEST_REFUSED' } });
    expect(b.count('/kbs/v0/resource/default/key/one')).toBe(0);
  });

  it('a refused resource: ATTEST_RESOURCE_REFUSED naming it with the broker detail; the session stays', async () => {
    const b = new ScriptedBroker();
    const { c } = client(b);
    const e = await rejection(c.resource('kbs:///default/key/denied'));
    expect(e).toMatchObject({ reason: 'ATTEST_RESOURCE_REFUSED', kind: 'unauthenticated' });
    expect(e.message).toContain('default/key/denied');
    expect(e.message).toContain('allowed to [prod]; this session matched [lab]');
    expect(e.details).toMatchObject({ resource: 'default/key/denied', status: 403 });
    const missing = await rejection(c.resource('default/key/absent'));
    expect(missing).toMatchObject({ reason: 'ATTEST_RESOURCE_REFUSED', kind: 'not_found' });
    expect(missing.message).toContain('no resource default/key/absent');
    expect(c.status()).toMatchObject({ state: 'attested', lastError: { reason: 'ATTEST_RESOURCE_REFUSED' } });
    expect(b.count('/kbs/v0/auth')).toBe(1);
  });

  it('a session the broker forgot (401 on a resource): attests again once with a new key, then reads it', async () => {
    const b = new ScriptedBroker();
    const { c, ev } = client(b);
    await c.attest();
    b.sessions.clear();
    expect((await c.resource('default/key/one')).equals(SECRET)).toBe(true);
    expect(ev.rounds).toBe(2);
    const keys = b.calls.filter((x) => x.path === '/kbs/v0/attest').map((x) => (x.body as KbsAttestation)['runtime-data']['tee-pubkey']);
    expect(keys).toHaveLength(2);
    expect(keys[0]).not.toEqual(keys[1]);
    // Still 401 after a fresh session: refused, not a loop.
    b.script.push(undefined, undefined, undefined, () => errorInfo(401, 'TokenNotFound', 'gone again'));
    b.sessions.clear();
    const e = await rejection(c.resource('default/key/one'));
    expect(e.reason).toBe('ATTEST_RESOURCE_REFUSED');
    expect(e.message).toContain('gone again');
  });

  it('protocol faults: no session cookie, a Challenge or token that is not one, a resource that does not decrypt', async () => {
    const noCookie = new ScriptedBroker();
    noCookie.script.push(() => json(200, { nonce: 'bm9uY2U=', 'extra-params': {} }));
    expect((await rejection(client(noCookie).c.attest())).reason).toBe('ATTEST_BROKER_PROTOCOL');

    const badChallenge = new ScriptedBroker();
    badChallenge.script.push(() => json(200, { nonce: 1 }, 's9'));
    expect((await rejection(client(badChallenge).c.attest())).reason).toBe('ATTEST_MESSAGE_INVALID');

    const notJson = new ScriptedBroker();
    notJson.script.push(() => ({ status: 200, contentType: 'text/html', setSessionId: 's1', body: Buffer.from('<html>') }));
    expect((await rejection(client(notJson).c.attest())).reason).toBe('ATTEST_BROKER_PROTOCOL');

    const wrongKey = new ScriptedBroker();
    const other = await import('../../../src/attest/jwe.js').then((m) => m.generateTeeKeyPair());
    wrongKey.script.push(undefined, undefined, async () => json(200, await encryptResource(SECRET, other.publicJwk)));
    expect((await rejection(client(wrongKey).c.resource('default/key/one'))).reason).toBe('ATTEST_JWE_INVALID');
  });

  it('an evidence source that fails: ATTEST_EVIDENCE_FAILED, and the round is ended', async () => {
    const b = new ScriptedBroker();
    const ev = evidence();
    const failing: EvidenceSource = {
      tee: 'tpm',
      begin: async () => {
        const round = await ev.begin();
        return { ...round, evidence: () => Promise.reject(new Error('TPM2_Quote failed')) };
      },
    };
    const { c } = client(b, { evidence: failing });
    const e = await rejection(c.attest());
    expect(e.reason).toBe('ATTEST_EVIDENCE_FAILED');
    expect(e.message).toContain('TPM2_Quote failed');
    expect(ev.ended).toBe(1);
  });

  it('refuses a bad resource name before any request', async () => {
    const b = new ScriptedBroker();
    const { c } = client(b);
    expect((await rejection(c.resource('kbs:///default/../x'))).reason).toBe('ATTEST_RESOURCE_PATH_INVALID');
    expect((await rejection(c.resource('only/two'))).reason).toBe('ATTEST_RESOURCE_PATH_INVALID');
    expect(b.calls).toEqual([]);
  });
});
