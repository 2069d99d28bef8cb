import { createHash, generateKeyPairSync } from 'node:crypto';
import { decodeJwt } from 'jose';
import { beforeEach, describe, expect, it } from 'vitest';
import { decryptResource, generateTeeKeyPair, type TeeKeyPair } from '../../../src/attest/jwe.js';
import { KBS_ERROR_TYPES, type KbsRuntimeData, runtimeDataBytes } from '../../../src/attest/kbs-protocol.js';
import { BROKER_POLICY_SCHEMA, type BrokerPolicy } from '../../../src/broker/policy.js';
import { BODY_LIMITS, type BrokerRequest, BrokerService, type ServiceConfig } from '../../../src/broker/service.js';
import { SessionTable } from '../../../src/broker/sessions.js';
import { TokenSigner } from '../../../src/broker/token.js';
import { verifierTable } from '../../../src/broker/verifiers.js';
import type { ReferenceValues } from '../../../src/measure/reference-values.js';
import { Clock, fakeTpmVerifier, hex, MemorySink, vtpmReference } from './fixtures.js';

const INITDATA = 'version = "0.1.0"\nalgorithm = "sha256"\n';
const INITDATA_SHA = createHash('sha256').update(INITDATA).digest('hex');
const GOOD_PCRS = { '4': hex('4'), '8': hex('8'), '9': hex('9') };

class MemoryConfig implements ServiceConfig {
  policy: BrokerPolicy = { schema: BROKER_POLICY_SCHEMA, resources: [] };
  references: ReadonlyMap<string, ReferenceValues> = new Map();
  resources = new Map<string, Buffer>();
  refreshes = 0;
  async refresh(): Promise<void> {
    this.refreshes++;
  }
  async readResource(path: string): Promise<Buffer | undefined> {
    return this.resources.get(path);
  }
}

let clock: Clock;
let log: MemorySink;
let config: MemoryConfig;
let sessions: SessionTable;
let service: BrokerService;
const signer = TokenSigner.fromPem(
  generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).privateKey.export({ format: 'pem', type: 'pkcs8' }) as string,
);
const keyPair: TeeKeyPair = await generateTeeKeyPair('EC-P256');

beforeEach(() => {
  clock = new Clock();
  log = new MemorySink();
  config = new MemoryConfig();
  config.references = new Map([
    ['web', vtpmReference(GOOD_PCRS, INITDATA_SHA, 'web')],
    ['db', vtpmReference({ ...GOOD_PCRS, '9': hex('e') }, INITDATA_SHA, 'db')],
  ]);
  config.policy = {
    schema: BROKER_POLICY_SCHEMA,
    resources: [
      { path: 'lab/key/web', allow: ['web'] },
      { path: 'lab/key/db', allow: ['db'] },
      { path: 'lab/key/missing', allow: ['web'] },
    ],
  };
  config.resources.set('lab/key/web', Buffer.from('web-secret'));
  config.resources.set('lab/key/db', Buffer.from('db-secret'));
  sessions = new SessionTable({ sessionTtlMs: 300_000, nonceTtlMs: 60_000, maxSessions: 4 }, clock.now);
  service = new BrokerService({ verifiers: verifierTable([fakeTpmVerifier()]), config, signer, sessions, log, now: clock.now });
});

const post = (url: string, body: unknown, cookie?: string, contentType = 'application/json'): BrokerRequest => ({
  method: 'POST',
  url,
  contentType,
  cookie,
  body: Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)),
});
const get = (url: string, cookie?: string): BrokerRequest => ({
  method: 'GET',
  url,
  contentType: undefined,
  cookie,
  body: Buffer.alloc(0),
});

async function auth(): Promise<{ cookie: string; nonce: string }> {
  const res = await service.handle(post('/kbs/v0/auth', { version: '0.4.0', tee: 'tpm', 'extra-params': {} }));
  expect(res.status).toBe(200);
  const cookie = (res.headers['set-cookie'] ?? '').split(';')[0] as string;
  expect(cookie).toMatch(/^kbs-session-id=[A-Za-z0-9_-]{43}$/);
  return { cookie, nonce: (JSON.parse(res.body) as { nonce: string }).nonce };
}

function attestation(
  nonce: string,
  measurements: Record<string, string> = {},
  over: Partial<{ bound: string; initdata: string | null }> = {},
) {
  const runtimeData: KbsRuntimeData = { nonce, 'tee-pubkey': keyPair.publicJwk };
  const bound = over.bound ?? createHash('sha256').update(runtimeDataBytes(runtimeData)).digest('hex');
  const initdata = over.initdata === undefined ? INITDATA : over.initdata;
  return {
    ...(initdata === null ? {} : { 'init-data': { format: 'toml', body: initdata } }),
    'runtime-data': runtimeData,
    'tee-evidence': {
      primary_evidence: { measurements: { tpm_pcr4: hex('4'), tpm_pcr8: hex('8'), tpm_pcr9: hex('9'), ...measurements }, bound },
      additional_evidence: '',
    },
  };
}

async function attested(measurements: Record<string, string> = {}): Promise<string> {
  const { cookie, nonce } = await auth();
  const res = await service.handle(post('/kbs/v0/attest', attestation(nonce, measurements), cookie));
  expect(res.status, res.body).toBe(200);
  return cookie;
}

const info = (body: string) => JSON.parse(body) as { type: string; detail: string };

describe('auth', () => {
  it('answers a 44-character fresh nonce, the verifier extra-params and a cookie', async () => {
    const a = await auth();
    const b = await auth();
    expect(Buffer.from(a.nonce, 'base64').length).toBe(32);
    expect(a.nonce).not.toBe(b.nonce);
    expect(a.cookie).not.toBe(b.cookie);
    expect(log.last('auth')).toMatchObject({ outcome: 'granted', tee: 'tpm' });
    expect(JSON.stringify(log.lines)).not.toContain(a.cookie.split('=')[1]);
  });

  it.each([
    ['a bad version', { version: '0.3.0', tee: 'tpm', 'extra-params': {} }, 401, 'attestation', 'version "0.3.0" is not accepted'],
    [
      'an unknown tee',
      { version: '0.4.0', tee: 'snp', 'extra-params': '' },
      401,
      'attestation',
      'tee snp has no verifier in this broker (it verifies: tpm)',
    ],
    ['a tee not in the protocol', { version: '0.4.0', tee: 'tpmx', 'extra-params': {} }, 400, 'malformed', '/tee must be one of'],
    ['a missing field', { version: '0.4.0', tee: 'tpm' }, 400, 'malformed', "must have required property 'extra-params'"],
    [
      'extra-params the verifier refuses',
      { version: '0.4.0', tee: 'tpm', 'extra-params': 'x' },
      400,
      'malformed',
      'extra-params must be an object',
    ],
    ['not JSON', '{"version":', 400, 'malformed', 'Request is not JSON'],
  ] as const)('refuses %s', async (_what, body, status, type, detail) => {
    const res = await service.handle(post('/kbs/v0/auth', body));
    expect(res.status).toBe(status);
    expect(info(res.body).type).toBe(KBS_ERROR_TYPES[type]);
    expect(info(res.body).detail).toContain(detail);
    expect(res.headers['set-cookie']).toBeUndefined();
    expect(log.last('auth')).toMatchObject({ outcome: 'refused', status });
  });

  it('refuses a wrong content type, an oversized body, a wrong method, an unknown path', async () => {
    expect((await service.handle(post('/kbs/v0/auth', {}, undefined, 'text/plain'))).status).toBe(415);
    expect(log.last('auth')).toMatchObject({
      outcome: 'refused',
      status: 415,
      reason: '/kbs/v0/auth takes application/json, got "text/plain"',
    });
    expect((await service.handle(post('/kbs/v0/auth', {}, undefined, 'application/json; charset=utf-8'))).status).toBe(400);
    expect((await service.handle({ ...post('/kbs/v0/auth', {}), body: Buffer.alloc(BODY_LIMITS.authBytes + 1) })).status).toBe(413);
    const wrong = await service.handle(get('/kbs/v0/auth'));
    expect([wrong.status, wrong.headers.allow]).toEqual([405, 'POST']);
    expect((await service.handle(get('/kbs/v1/auth'))).status).toBe(404);
    expect((await service.handle(get('/'))).status).toBe(404);
    expect(log.last('error')).toMatchObject({ outcome: 'refused', status: 404, url: '/' });
    expect(log.last('auth')).toMatchObject({ status: 405, method: 'GET' });
  });

  it('refuses new sessions once the table is full of live ones, and takes them again after expiry', async () => {
    for (let i = 0; i < 4; i++) await auth();
    const full = await service.handle(post('/kbs/v0/auth', { version: '0.4.0', tee: 'tpm', 'extra-params': {} }));
    expect(full.status).toBe(503);
    expect(info(full.body).type).toBe(KBS_ERROR_TYPES.busy);
    clock.advance(300_001);
    await auth();
  });
});

describe('attest', () => {
  it('grants a token naming the matched set (and only it), bound to the tee-pubkey, expiring with the session', async () => {
    const { cookie, nonce } = await auth();
    const res = await service.handle(post('/kbs/v0/attest', attestation(nonce), cookie));
    expect(res.status, res.body).toBe(200);
    const { token } = JSON.parse(res.body) as { token: string };
    const claims = await signer.verify(token, clock.t);
    expect(claims.matched).toEqual(['web']);
    expect(claims.tee).toBe('tpm');
    expect(claims['tee-pubkey']).toEqual(keyPair.publicJwk);
    expect(claims.exp).toBe(Math.floor((clock.t + 300_000) / 1000));
    expect(decodeJwt(token).iss).toBe('kata-ts-broker');
    const line = log.last('attest');
    expect(line).toMatchObject({ outcome: 'granted', matched: ['web'], claims: { tpm_pcr9: hex('9'), init_data: INITDATA_SHA } });
    // The set not matched is in the log with the claim that differs.
    expect((line?.mismatches as Record<string, unknown> | undefined)?.db).toEqual([
      { field: 'tpm_pcr9', reason: 'tpm_pcr9 differs from the reference', expected: hex('e'), actual: hex('9') },
    ]);
  });

  it('refuses evidence matching no set, naming each set and the claim that differs (expected/actual)', async () => {
    const { cookie, nonce } = await auth();
    const res = await service.handle(post('/kbs/v0/attest', attestation(nonce, { tpm_pcr9: hex('f') }), cookie));
    expect(res.status).toBe(401);
    expect(info(res.body).detail).toContain(`db: tpm_pcr9: tpm_pcr9 differs from the reference (expected ${hex('e')}, got ${hex('f')})`);
    expect(info(res.body).detail).toContain(`web: tpm_pcr9: tpm_pcr9 differs from the reference (expected ${hex('9')}, got ${hex('f')})`);
    expect(log.last('attest')).toMatchObject({ outcome: 'refused', status: 401 });
    // The session has not attested: resources stay closed.
    expect((await service.handle(get('/kbs/v0/resource/lab/key/web', cookie))).status).toBe(401);
  });

  it('refuses when the initdata sent is not the one the references were made with', async () => {
    const { cookie, nonce } = await auth();
    const res = await service.handle(
      post('/kbs/v0/attest', attestation(nonce, {}, { initdata: 'version = "0.1.0"\n# another\n' }), cookie),
    );
    expect(res.status).toBe(401);
    expect(info(res.body).detail).toContain('init_data: init_data differs from the reference');
  });

  it('refuses when no reference set is held', async () => {
    config.references = new Map();
    const { cookie, nonce } = await auth();
    const res = await service.handle(post('/kbs/v0/attest', attestation(nonce), cookie));
    expect(res.status).toBe(401);
    expect(info(res.body).detail).toBe('the evidence verified but the broker holds no reference set');
  });

  it("refuses the verifier's failures, naming the field", async () => {
    const { cookie, nonce } = await auth();
    const res = await service.handle(post('/kbs/v0/attest', attestation(nonce, {}, { bound: hex('0') }), cookie));
    expect(res.status).toBe(401);
    expect(info(res.body).detail).toMatch(/^evidence refused: report_data: evidence is not bound to the runtime data/);
    expect(log.last('attest')?.failures).toEqual([expect.objectContaining({ field: 'report_data' })]);
  });

  it('refuses a nonce that is not the session one, and a nonce once used (single use) or expired', async () => {
    const a = await auth();
    const wrong = await service.handle(post('/kbs/v0/attest', attestation('bm90IG1pbmU='), a.cookie));
    expect(info(wrong.body).detail).toContain('nonce: runtime-data.nonce is not the nonce of this session');
    // The try used the nonce up: even the right one is refused now.
    const again = await service.handle(post('/kbs/v0/attest', attestation(a.nonce), a.cookie));
    expect([again.status, info(again.body).detail]).toEqual([
      401,
      'the nonce of this session was used already: start again at /kbs/v0/auth',
    ]);

    const b = await auth();
    clock.advance(60_001);
    const late = await service.handle(post('/kbs/v0/attest', attestation(b.nonce), b.cookie));
    expect([late.status, info(late.body).detail]).toEqual([401, 'the nonce has expired: start again at /kbs/v0/auth']);
  });

  it('a malformed Attestation does not use the nonce up (the guest may resend it well formed)', async () => {
    const a = await auth();
    const bad = await service.handle(post('/kbs/v0/attest', { 'runtime-data': {} }, a.cookie));
    expect(bad.status).toBe(400);
    expect((await service.handle(post('/kbs/v0/attest', attestation(a.nonce), a.cookie))).status).toBe(200);
  });

  it('refuses a second attestation on an attested session', async () => {
    const cookie = await attested();
    const res = await service.handle(post('/kbs/v0/attest', attestation('eA=='), cookie));
    expect([res.status, info(res.body).detail]).toEqual([401, 'this session has attested already: start again at /kbs/v0/auth']);
  });

  it('refuses no cookie, an unknown one, a malformed one, an expired session', async () => {
    const body = attestation('eA==');
    for (const cookie of [undefined, 'kbs-session-id=nope', 'kbs-session-id=a b', 'other=1', 'kbs-session-id=a; kbs-session-id=b']) {
      const res = await service.handle(post('/kbs/v0/attest', body, cookie));
      expect(res.status).toBe(401);
      expect(info(res.body).type).toBe(KBS_ERROR_TYPES.attestation);
    }
    const a = await auth();
    clock.advance(300_000);
    const res = await service.handle(post('/kbs/v0/attest', attestation(a.nonce), a.cookie));
    expect(info(res.body).detail).toBe('the session has expired: start again at /kbs/v0/auth');
  });

  it('turns a verifier that throws into a 500 and a log line, and keeps answering', async () => {
    const a = await auth();
    const body = attestation(a.nonce);
    (body['tee-evidence'].primary_evidence as Record<string, unknown>).throwBug = true;
    const res = await service.handle(post('/kbs/v0/attest', body, a.cookie));
    expect(res.status).toBe(500);
    expect(info(res.body).type).toBe(KBS_ERROR_TYPES.internal);
    expect(log.last('error')).toMatchObject({ outcome: 'failed', error: 'a bug in the verifier' });
    await attested();
  });
});

describe('resources', () => {
  it('releases an allowed resource as JWE to the session key, and logs it without the bytes', async () => {
    const cookie = await attested();
    const res = await service.handle(get('/kbs/v0/resource/lab/key/web', cookie));
    expect(res.status, res.body).toBe(200);
    expect(Buffer.from(await decryptResource(JSON.parse(res.body), keyPair.privateKey)).toString()).toBe('web-secret');
    expect(log.last('resource')).toMatchObject({ outcome: 'released', path: 'lab/key/web', allowedBy: 'web', bytes: 10 });
    expect(JSON.stringify(log.lines)).not.toContain('web-secret');
  });

  it('refuses (403) a resource the matched sets are not allowed, and one the policy does not list', async () => {
    const cookie = await attested();
    const db = await service.handle(get('/kbs/v0/resource/lab/key/db', cookie));
    expect([db.status, info(db.body).type]).toEqual([403, KBS_ERROR_TYPES.policyDeny]);
    expect(info(db.body).detail).toBe('lab/key/db is allowed to [db]; this session matched [web]');
    const unlisted = await service.handle(get('/kbs/v0/resource/lab/key/other', cookie));
    expect([unlisted.status, info(unlisted.body).detail]).toEqual([403, 'the policy lists no resource lab/key/other']);
  });

  it('answers 404 for an allowed resource that is not stored, and for invalid paths before looking at the session', async () => {
    const cookie = await attested();
    const missing = await service.handle(get('/kbs/v0/resource/lab/key/missing', cookie));
    expect([missing.status, info(missing.body).type]).toEqual([404, KBS_ERROR_TYPES.resourceNotFound]);
    for (const p of ['lab/key', 'lab/../web', 'lab/key/web/x', 'lab/key/%2e%2e', 'lab//web', 'lab/key/web?x=1'])
      expect((await service.handle(get(`/kbs/v0/resource/${p}`))).status, p).toBe(404);
  });

  it('refuses (401) without a session, before attestation, after expiry', async () => {
    expect((await service.handle(get('/kbs/v0/resource/lab/key/web'))).status).toBe(401);
    const a = await auth();
    const early = await service.handle(get('/kbs/v0/resource/lab/key/web', a.cookie));
    expect([early.status, info(early.body).type]).toEqual([401, KBS_ERROR_TYPES.tokenNotFound]);
    const cookie = await attested();
    clock.advance(300_000);
    const late = await service.handle(get('/kbs/v0/resource/lab/key/web', cookie));
    expect([late.status, info(late.body).detail]).toEqual([401, 'the session has expired: start again at /kbs/v0/auth']);
  });

  it('applies a policy change from the next request on (the live config is refreshed per request)', async () => {
    const cookie = await attested();
    const before = config.refreshes;
    config.policy = { schema: BROKER_POLICY_SCHEMA, resources: [{ path: 'lab/key/db', allow: ['db', 'web'] }] };
    expect((await service.handle(get('/kbs/v0/resource/lab/key/db', cookie))).status).toBe(200);
    expect((await service.handle(get('/kbs/v0/resource/lab/key/web', cookie))).status).toBe(403);
    expect(config.refreshes).toBe(before + 2);
  });

  it('takes only GET', async () => {
    const res = await service.handle(post('/kbs/v0/resource/lab/key/web', {}));
    expect([res.status, res.headers.allow]).toEqual([405, 'GET']);
  });
});
