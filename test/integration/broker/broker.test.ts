/**
 * `kata-ts broker` as a real child process (node --import tsx src/cli/entry.ts broker serve) on
 * 127.0.0.1 with a kernel-chosen port and a state dir this test made with `broker init`; every
 * admin step goes through the CLI too.
 *
 * Evidence comes from real software TPMs (test/helpers/tpm-evidence-tool.ts: swtpm with an EK
 * certificate from a node CA made by src/tpm/ca.ts, the guest's own TPM code; the firmware's
 * measurements are the tool's stand-in, named so there), verified by the real tpm verifier the
 * broker registers from the CA bundle it is given:
 *  - a full RCAR round for a pod matching the "web" reference set: token, then its resource
 *    released as JWE that only the round's key decrypts; another set's resource refused (403);
 *  - a pod with other initdata: attestation refused naming tpm_pcr8 and init_data, resources closed;
 *  - every endpoint fed malformed input (each field missing or of the wrong type, oversized
 *    bodies, wrong content type, unknown tee, bad version, no/unknown/expired cookie, resource
 *    before attestation, path traversal, garbage below HTTP), each answered with its status and
 *    an ErrorInformation body, the process still alive and serving after each group;
 *  - admin changes picked up without restart, and a bad hand-edited policy keeping the old one.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash, createPublicKey, type KeyObject } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { jwtVerify } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decryptResource } from '../../../src/attest/jwe.js';
import { KBS_ERROR_TYPES, type KbsRuntimeData } from '../../../src/attest/kbs-protocol.js';
import { packageRoot } from '../../../src/common/paths.js';
import { REFERENCE_VALUES_SCHEMA, type ReferenceValues } from '../../../src/measure/reference-values.js';
import { until } from '../../helpers/poll.js';
import { scaledMs } from '../../helpers/time-scale.js';
import { makeToolCa, type ToolCa, TpmEvidenceTool, teeRuntimeData, tpmEvidenceToolMissing } from '../../helpers/tpm-evidence-tool.js';

const DOC =
  'version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n"aa.toml" = \'\'\'\n[token_configs.kbs]\nurl = "https://127.0.0.1"\n\'\'\'\n';
const OTHER_DOC = `${DOC}# another pod's document\n`;
const WEB_SECRET = 'web-secret-\u00e9-bytes';
const DB_SECRET = 'db-secret';
const missing = tpmEvidenceToolMissing();

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

interface Serve {
  child: ChildProcess;
  port: number;
  stderr: () => string;
  stop(): Promise<void>;
}

function cli(args: string[], input?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      ['--import', 'tsx', 'src/cli/entry.ts', 'broker', ...args],
      { cwd: packageRoot(), timeout: scaledMs(60_000) },
      (err, stdout, stderr) => resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr }),
    );
    if (input !== undefined) child.stdin?.end(input);
    else child.stdin?.end();
  });
}

async function startServe(dir: string, extra: string[]): Promise<Serve> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'src/cli/entry.ts', 'broker', 'serve', '--dir', dir, '--listen', '127.0.0.1:0', ...extra],
    { cwd: packageRoot(), stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout?.on('data', (c: Buffer) => {
    out += c.toString();
  });
  child.stderr?.on('data', (c: Buffer) => {
    err += c.toString();
  });
  const stop = async () => {
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise<void>((r) => child.once('exit', () => r()));
    process.kill(child.pid, 'SIGTERM');
    const timer = setTimeout(() => {
      if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
    }, scaledMs(15_000));
    await gone;
    clearTimeout(timer);
  };
  try {
    const port = await until(
      'broker serve to listen',
      async (note) => {
        note({ stdout: out, stderr: err.slice(-500), exit: child.exitCode });
        if (child.exitCode !== null) throw new Error(`broker serve exited ${child.exitCode}: ${err}`);
        const m = /listening on https:\/\/127\.0\.0\.1:([0-9]+)/.exec(out);
        return m === null ? undefined : Number(m[1]);
      },
      60_000,
    );
    return { child, port, stderr: () => err, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

describe.skipIf(missing.length > 0)('kata-ts broker serve, a real process', () => {
  let tmp: string;
  let dir: string;
  let cert: string;
  let ca: ToolCa | undefined;
  const tools: TpmEvidenceTool[] = [];
  let pod: TpmEvidenceTool;
  let otherPod: TpmEvidenceTool;
  let serve: Serve | undefined;
  let shortServe: Serve | undefined;

  function request(
    port: number,
    method: string,
    target: string,
    opts: { body?: string | Buffer; contentType?: string | null; cookie?: string; headers?: Record<string, string> } = {},
  ): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { ...opts.headers };
      if (opts.contentType !== null) headers['content-type'] = opts.contentType ?? 'application/json';
      if (opts.cookie !== undefined) headers.cookie = opts.cookie;
      const req = https.request({ host: '127.0.0.1', port, method, path: target, ca: cert, headers, agent: false }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(opts.body);
    });
  }

  const post = (target: string, body: unknown, opts: { cookie?: string; contentType?: string | null } = {}) =>
    request((serve as Serve).port, 'POST', target, { ...opts, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const getResource = (p: string, cookie?: string) =>
    request((serve as Serve).port, 'GET', `/kbs/v0/resource/${p}`, cookie === undefined ? {} : { cookie });

  function errorInfo(a: Answer): { type: string; detail: string } {
    expect(a.headers['content-type']).toBe('application/json');
    const doc = JSON.parse(a.body) as { type: string; detail: string };
    expect(Object.keys(doc).sort()).toEqual(['detail', 'type']);
    return doc;
  }

  const cookieOf = (a: Answer) => String((a.headers['set-cookie'] as string[] | undefined)?.[0] ?? '').split(';')[0] as string;

  async function auth(tool: TpmEvidenceTool = pod, port?: number): Promise<{ cookie: string; nonce: string; extra: unknown }> {
    const a = await request(port ?? (serve as Serve).port, 'POST', '/kbs/v0/auth', {
      body: JSON.stringify({ version: '0.4.0', tee: 'tpm', 'extra-params': tool.requestExtraParams() }),
    });
    expect(a.status, a.body).toBe(200);
    const ch = JSON.parse(a.body) as { nonce: string; 'extra-params': unknown };
    return { cookie: cookieOf(a), nonce: ch.nonce, extra: ch['extra-params'] };
  }

  async function attestation(tool: TpmEvidenceTool, nonce: string, extra: unknown, initdata: string) {
    const rd = teeRuntimeData(nonce);
    const evidence = await tool.evidence(extra, rd.bytes);
    const body = {
      'init-data': { format: 'toml', body: initdata },
      'runtime-data': rd.runtimeData,
      'tee-evidence': { primary_evidence: evidence, additional_evidence: '' },
    };
    return { body, privateKey: rd.privateKey, runtimeData: rd.runtimeData };
  }

  /** The process is still running and answers a fresh, valid auth. */
  async function stillServing(): Promise<void> {
    expect((serve as Serve).child.exitCode).toBeNull();
    expect((serve as Serve).child.signalCode).toBeNull();
    await auth();
  }

  async function decisions(): Promise<Array<Record<string, unknown>>> {
    const text = await fsp.readFile(path.join(dir, 'decisions.log'), 'utf8');
    return text
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  }

  function reference(pcrs: Record<number, string>, initdata: string, name: string): ReferenceValues {
    return {
      schema: REFERENCE_VALUES_SCHEMA,
      pod: { name, namespace: 'lab', uid: `uid-${name}` },
      handler: 'kata-ts-cvm',
      tee: 'vtpm',
      inputs: {
        kernelSha256: '1'.repeat(64),
        initrdSha256: '2'.repeat(64),
        cmdline: 'console=ttyS0',
        ramBelow4GiBBytes: 1 << 30,
        initdataSha256: createHash('sha256').update(initdata).digest('hex'),
      },
      vtpm: {
        bank: 'sha256',
        pcrs: { '4': pcrs[4] as string, '8': pcrs[8] as string, '9': pcrs[9] as string },
        events: [],
        notPredicted: [],
      },
    };
  }

  beforeAll(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-broker-it-'));
    dir = path.join(tmp, 'state');
    ca = await makeToolCa(tmp);
    pod = await TpmEvidenceTool.start({ ca, initdata: Buffer.from(DOC), parentDir: tmp });
    tools.push(pod);
    otherPod = await TpmEvidenceTool.start({ ca, initdata: Buffer.from(OTHER_DOC), parentDir: tmp });
    tools.push(otherPod);

    const init = await cli(['init', '--dir', dir, '--san', 'DNS:localhost,IP:127.0.0.1']);
    expect(init.code, init.stderr).toBe(0);
    expect(init.stdout).toContain(path.join(dir, 'tls', 'cert.pem'));
    cert = await fsp.readFile(path.join(dir, 'tls', 'cert.pem'), 'utf8');
    const bundle = path.join(tmp, 'bundle.pem');
    await fsp.writeFile(bundle, ca.bundlePem);

    // The "web" set is the pod's PCRs as its TPM holds them (the stand-in firmware's); "db"
    // differs in PCR 9, as another image would.
    const pcrs = await pod.pcrs([4, 8, 9]);
    await fsp.writeFile(path.join(tmp, 'web.json'), JSON.stringify(reference(pcrs, DOC, 'web')));
    await fsp.writeFile(
      path.join(tmp, 'db.json'),
      JSON.stringify({ referenceValues: reference({ ...pcrs, 9: 'e'.repeat(64) }, DOC, 'db') }),
    );
    for (const name of ['web', 'db']) {
      const r = await cli(['reference', 'add', name, '--dir', dir, '--file', path.join(tmp, `${name}.json`)]);
      expect(r.code, r.stderr).toBe(0);
    }
    await fsp.writeFile(path.join(tmp, 'web.secret'), WEB_SECRET);
    expect((await cli(['resource', 'set', 'lab/key/web', '--dir', dir, '--file', path.join(tmp, 'web.secret')])).code).toBe(0);
    expect((await cli(['resource', 'set', 'lab/key/db', '--dir', dir, '--stdin'], DB_SECRET)).code).toBe(0);
    await fsp.writeFile(
      path.join(tmp, 'policy.json'),
      JSON.stringify({
        schema: 'kata-ts/broker-policy/v1',
        resources: [
          { path: 'lab/key/web', allow: ['web'] },
          { path: 'lab/key/db', allow: ['db'] },
          { path: 'lab/key/absent', allow: ['web'] },
        ],
      }),
    );
    expect((await cli(['policy', 'set', '--dir', dir, '--file', path.join(tmp, 'policy.json')])).code).toBe(0);

    serve = await startServe(dir, ['--tpm-ca-bundle', bundle]);
    shortServe = await startServe(dir, ['--tpm-ca-bundle', bundle, '--session-ttl-seconds', '1', '--nonce-ttl-seconds', '1']);
  });

  afterAll(async () => {
    await serve?.stop();
    await shortServe?.stop();
    for (const t of tools) await t.close();
    await ca?.cleanup();
    if (tmp !== undefined) await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('admin commands list without contents and refuse bad input with a coded error, changing nothing', async () => {
    const list = await cli(['resource', 'list', '--dir', dir, '--json']);
    expect(JSON.parse(list.stdout)).toEqual([
      { path: 'lab/key/db', bytes: DB_SECRET.length },
      { path: 'lab/key/web', bytes: Buffer.byteLength(WEB_SECRET) },
    ]);
    expect(list.stdout).not.toContain(WEB_SECRET);
    const refs = await cli(['reference', 'list', '--dir', dir]);
    expect(refs.stdout).toBe('db\ttpm\tlab/db\nweb\ttpm\tlab/web\n');
    const badPath = await cli(['resource', 'set', 'lab/../x', '--dir', dir, '--stdin'], 'x');
    expect([badPath.code, badPath.stderr]).toEqual([1, expect.stringContaining('ATTEST_RESOURCE_PATH_INVALID')]);
    const badRef = await cli(['reference', 'add', 'x', '--dir', dir, '--file', path.join(tmp, 'policy.json')]);
    expect([badRef.code, badRef.stderr]).toEqual([1, expect.stringContaining('BROKER_REFERENCE_INVALID')]);
    const badPolicy = await cli(['policy', 'set', '--dir', dir, '--file', path.join(tmp, 'web.json')]);
    expect([badPolicy.code, badPolicy.stderr]).toEqual([1, expect.stringContaining('BROKER_POLICY_INVALID: policy does not match')]);
    const noFile = await cli(['reference', 'add', 'x', '--dir', dir, '--file', path.join(tmp, 'none.json')]);
    expect([noFile.code, noFile.stderr]).toEqual([1, expect.stringContaining('BROKER_CONFIG_INVALID')]);
    const usage = await cli(['resource', 'set', '--dir', dir]);
    expect(usage.code).toBe(2);
    expect((await cli(['reference', 'list', '--dir', dir])).stdout).toBe(refs.stdout);
    expect(JSON.parse((await cli(['policy', 'show', '--dir', dir])).stdout).resources).toHaveLength(3);
  });

  it('a full RCAR round: token for the matched set, the resource as JWE only the round key opens, another set refused', async () => {
    const { cookie, nonce, extra } = await auth();
    expect(Buffer.from(nonce, 'base64')).toHaveLength(32);
    const round = await attestation(pod, nonce, extra, DOC);
    const a = await post('/kbs/v0/attest', round.body, { cookie });
    expect(a.status, a.body).toBe(200);
    const { token } = JSON.parse(a.body) as { token: string };
    const header = JSON.parse(Buffer.from(token.split('.')[0] as string, 'base64url').toString()) as { alg: string };
    expect(header.alg).toBe('ES256');
    const unverified = JSON.parse(Buffer.from(token.split('.')[1] as string, 'base64url').toString()) as { jwk: Record<string, string> };
    const brokerKey = createPublicKey({ key: unverified.jwk, format: 'jwk' });
    const { payload } = await jwtVerify(token, brokerKey, { issuer: 'kata-ts-broker' });
    expect(payload.matched).toEqual(['web']);
    expect(payload.tee).toBe('tpm');
    expect(payload['tee-pubkey']).toEqual((round.runtimeData as KbsRuntimeData)['tee-pubkey']);

    const r = await getResource('lab/key/web', cookie);
    expect(r.status, r.body).toBe(200);
    const jwe = JSON.parse(r.body) as Record<string, string>;
    expect(Buffer.from(await decryptResource(jwe, round.privateKey as KeyObject)).toString()).toBe(WEB_SECRET);
    // Nothing of the resource in clear on the wire, and another key does not open it.
    expect(r.body).not.toContain('web-secret');
    await expect(decryptResource(jwe, teeRuntimeData('x').privateKey)).rejects.toThrow(/does not decrypt/);

    const db = await getResource('lab/key/db', cookie);
    expect(db.status).toBe(403);
    expect(errorInfo(db)).toEqual({
      type: KBS_ERROR_TYPES.policyDeny,
      detail: 'lab/key/db is allowed to [db]; this session matched [web]',
    });
    const absent = await getResource('lab/key/absent', cookie);
    expect([absent.status, errorInfo(absent).type]).toEqual([404, KBS_ERROR_TYPES.resourceNotFound]);

    // A second attestation on the attested session, and the nonce once used, are refused.
    const again = await post('/kbs/v0/attest', round.body, { cookie });
    expect([again.status, errorInfo(again).detail]).toEqual([401, 'this session has attested already: start again at /kbs/v0/auth']);

    const log = await decisions();
    const granted = log.filter((l) => l.event === 'attest' && l.outcome === 'granted').at(-1);
    expect(granted).toMatchObject({ tee: 'tpm', matched: ['web'] });
    expect((granted?.mismatches as Record<string, Array<Record<string, string>>> | undefined)?.db).toEqual([
      expect.objectContaining({ field: 'tpm_pcr9', expected: 'e'.repeat(64) }),
    ]);
    expect(log.filter((l) => l.event === 'resource' && l.outcome === 'released').at(-1)).toMatchObject({
      path: 'lab/key/web',
      allowedBy: 'web',
    });
    const text = await fsp.readFile(path.join(dir, 'decisions.log'), 'utf8');
    expect(text).not.toContain(WEB_SECRET);
    expect(text).not.toContain(cookie.split('=')[1]);
  });

  it('a pod with other initdata is refused naming tpm_pcr8 and init_data, and reads nothing', async () => {
    const { cookie, nonce, extra } = await auth(otherPod);
    const round = await attestation(otherPod, nonce, extra, OTHER_DOC);
    const a = await post('/kbs/v0/attest', round.body, { cookie });
    expect(a.status, a.body).toBe(401);
    const info = errorInfo(a);
    expect(info.type).toBe(KBS_ERROR_TYPES.attestation);
    expect(info.detail).toMatch(/matched no reference set: .*web: .*tpm_pcr8: tpm_pcr8 differs from the reference/);
    expect(info.detail).toContain(
      `init_data: init_data differs from the reference (expected ${createHash('sha256').update(DOC).digest('hex')}`,
    );
    for (const p of ['lab/key/web', 'lab/key/db']) expect((await getResource(p, cookie)).status).toBe(401);
    const refused = (await decisions()).filter((l) => l.event === 'attest' && l.outcome === 'refused').at(-1);
    const web = (refused?.mismatches as Record<string, Array<{ field: string }>> | undefined)?.web;
    expect(web?.map((f) => f.field)).toEqual(['tpm_pcr8', 'init_data']);

    // The same pod presenting the document the web pod had: its PCR 8 betrays it.
    const s = await auth(otherPod);
    const lie = await attestation(otherPod, s.nonce, s.extra, DOC);
    const b = await post('/kbs/v0/attest', lie.body, { cookie: s.cookie });
    expect(b.status).toBe(401);
    expect(errorInfo(b).detail).toContain('init_data');
  });

  it('auth: each malformed Request is answered with its status and the process keeps serving', async () => {
    const good = { version: '0.4.0', tee: 'tpm', 'extra-params': pod.requestExtraParams() };
    const cases: Array<[string, unknown, number, keyof typeof KBS_ERROR_TYPES]> = [
      ['not JSON', '{"version"', 400, 'malformed'],
      ['an array', '[]', 400, 'malformed'],
      ['no version', { tee: 'tpm', 'extra-params': {} }, 400, 'malformed'],
      ['version a number', { ...good, version: 0.4 }, 400, 'malformed'],
      ['version 0.3.0', { ...good, version: '0.3.0' }, 401, 'attestation'],
      ['version 1.0.0', { ...good, version: '1.0.0' }, 401, 'attestation'],
      ['no tee', { version: '0.4.0', 'extra-params': {} }, 400, 'malformed'],
      ['tee not a KBS tee', { ...good, tee: 'vtpm' }, 400, 'malformed'],
      ['tee a number', { ...good, tee: 1 }, 400, 'malformed'],
      ['tee without a verifier here (snp)', { ...good, tee: 'snp', 'extra-params': '' }, 401, 'attestation'],
      ['tee sample', { ...good, tee: 'sample', 'extra-params': '' }, 401, 'attestation'],
      ['no extra-params', { version: '0.4.0', tee: 'tpm' }, 400, 'malformed'],
      ['extra-params empty for tpm', { ...good, 'extra-params': {} }, 400, 'malformed'],
      ['extra-params ek_cert a number', { ...good, 'extra-params': { ...pod.requestExtraParams(), ek_cert: 5 } }, 400, 'malformed'],
      ['an unknown key', { ...good, cookie: 'x' }, 400, 'malformed'],
    ];
    for (const [what, body, status, type] of cases) {
      const a = await post('/kbs/v0/auth', body);
      expect(a.status, what).toBe(status);
      expect(errorInfo(a).type, what).toBe(KBS_ERROR_TYPES[type]);
      expect(a.headers['set-cookie'], what).toBeUndefined();
    }
    // An EK certificate no trusted CA issued (a self-made one) is refused, not malformed.
    const foreignCa = await makeToolCa(tmp);
    const foreign = await TpmEvidenceTool.start({ ca: foreignCa, parentDir: tmp });
    tools.push(foreign);
    const f = await post('/kbs/v0/auth', { ...good, 'extra-params': foreign.requestExtraParams() });
    expect([f.status, errorInfo(f).detail]).toEqual([401, expect.stringContaining('is not signed by any CA of the trusted bundle')]);
    await foreign.close();
    await foreignCa.cleanup();

    expect((await post('/kbs/v0/auth', good, { contentType: 'text/plain' })).status).toBe(415);
    expect((await post('/kbs/v0/auth', good, { contentType: null })).status).toBe(415);
    expect((await post('/kbs/v0/auth', good, { contentType: 'application/json; charset=utf-8' })).status).toBe(200);
    const big = await post('/kbs/v0/auth', JSON.stringify({ ...good, pad: 'x'.repeat(70_000) }));
    expect([big.status, errorInfo(big).type]).toEqual([413, KBS_ERROR_TYPES.payloadTooLarge]);
    const get = await request((serve as Serve).port, 'GET', '/kbs/v0/auth');
    expect([get.status, get.headers.allow]).toEqual([405, 'POST']);
    expect((await request((serve as Serve).port, 'GET', '/kbs/v0/other')).status).toBe(404);
    expect((await request((serve as Serve).port, 'DELETE', '/')).status).toBe(404);
    await stillServing();
  });

  it('attest: no, unknown or expired cookie; each malformed field; wrong content type; oversize; nonce reuse and mismatch', async () => {
    const s = await auth();
    const round = await attestation(pod, s.nonce, s.extra, DOC);
    const body = round.body as Record<string, unknown>;
    const rd = body['runtime-data'] as Record<string, unknown>;
    const key = rd['tee-pubkey'] as Record<string, unknown>;
    const ev = body['tee-evidence'] as Record<string, unknown>;

    for (const cookie of [undefined, 'kbs-session-id=unknown', 'kbs-session-id=bad value', `kbs-session-id=${'a'.repeat(200)}`]) {
      const a = await post('/kbs/v0/attest', body, cookie === undefined ? {} : { cookie });
      expect(a.status, String(cookie)).toBe(401);
      expect(errorInfo(a).type).toBe(KBS_ERROR_TYPES.attestation);
    }

    const malformed: Array<[string, unknown]> = [
      ['not JSON', '{'],
      ['no runtime-data', { ...body, 'runtime-data': undefined }],
      ['runtime-data a string', { ...body, 'runtime-data': 'x' }],
      ['no nonce', { ...body, 'runtime-data': { 'tee-pubkey': key } }],
      ['nonce a number', { ...body, 'runtime-data': { ...rd, nonce: 1 } }],
      ['no tee-pubkey', { ...body, 'runtime-data': { nonce: s.nonce } }],
      ['tee-pubkey kty oct', { ...body, 'runtime-data': { ...rd, 'tee-pubkey': { ...key, kty: 'oct' } } }],
      ['tee-pubkey crv P-521', { ...body, 'runtime-data': { ...rd, 'tee-pubkey': { ...key, crv: 'P-521' } } }],
      ['tee-pubkey alg RSA1_5', { ...body, 'runtime-data': { ...rd, 'tee-pubkey': { ...key, alg: 'RSA1_5' } } }],
      ['tee-pubkey x off the curve', { ...body, 'runtime-data': { ...rd, 'tee-pubkey': { ...key, x: key.y, y: key.x } } }],
      ['no tee-evidence', { ...body, 'tee-evidence': undefined }],
      ['primary_evidence a number', { ...body, 'tee-evidence': { ...ev, primary_evidence: 1 } }],
      ['additional_evidence an object', { ...body, 'tee-evidence': { ...ev, additional_evidence: {} } }],
      ['init-data format yaml', { ...body, 'init-data': { format: 'yaml', body: DOC } }],
      ['init-data body an object', { ...body, 'init-data': { format: 'toml', body: {} } }],
      ['an unknown key', { ...body, extra: true }],
    ];
    for (const [what, doc] of malformed) {
      const a = await post('/kbs/v0/attest', doc, { cookie: s.cookie });
      expect(a.status, what).toBe(400);
      expect(errorInfo(a).type, what).toBe(KBS_ERROR_TYPES.malformed);
    }
    expect((await post('/kbs/v0/attest', body, { cookie: s.cookie, contentType: 'application/x-www-form-urlencoded' })).status).toBe(415);
    const huge = await post('/kbs/v0/attest', JSON.stringify({ ...body, pad: 'x'.repeat(5 * 1024 * 1024) }), { cookie: s.cookie });
    expect([huge.status, errorInfo(huge).type]).toEqual([413, KBS_ERROR_TYPES.payloadTooLarge]);

    // None of that used the nonce up: the well-formed evidence is still judged (and granted).
    expect((await post('/kbs/v0/attest', body, { cookie: s.cookie })).status).toBe(200);

    // Evidence over another nonce in a fresh session: refused, and that nonce is then spent.
    const t = await auth();
    const wrong = await post('/kbs/v0/attest', { ...body, 'runtime-data': { ...rd, nonce: s.nonce } }, { cookie: t.cookie });
    expect([wrong.status, errorInfo(wrong).detail]).toEqual([
      401,
      expect.stringContaining('nonce: runtime-data.nonce is not the nonce of this session'),
    ]);
    const late = await attestation(pod, t.nonce, t.extra, DOC);
    const reuse = await post('/kbs/v0/attest', late.body, { cookie: t.cookie });
    expect([reuse.status, errorInfo(reuse).detail]).toEqual([
      401,
      'the nonce of this session was used already: start again at /kbs/v0/auth',
    ]);

    // A session on the broker whose sessions live 1 s: once it has expired, attest is refused.
    const short = (shortServe as Serve).port;
    const e = await auth(pod, short);
    const expired = await until(
      'the 1 s session to expire',
      async (note) => {
        const a = await request(short, 'POST', '/kbs/v0/attest', { body: JSON.stringify(body), cookie: e.cookie });
        note(a.body);
        return a.status === 401 && a.body.includes('expired') ? a : undefined;
      },
      30_000,
      250,
    );
    expect(errorInfo(expired).detail).toBe('the session has expired: start again at /kbs/v0/auth');
    expect((shortServe as Serve).child.exitCode).toBeNull();
    await stillServing();
  });

  it('resource: no cookie, before attestation, traversal and malformed paths, wrong method', async () => {
    const none = await getResource('lab/key/web');
    expect([none.status, errorInfo(none).type]).toEqual([401, KBS_ERROR_TYPES.tokenNotFound]);
    expect((await getResource('lab/key/web', 'kbs-session-id=unknown')).status).toBe(401);
    const s = await auth();
    const early = await getResource('lab/key/web', s.cookie);
    expect([early.status, errorInfo(early).detail]).toEqual([401, 'this session has not attested: POST /kbs/v0/attest first']);

    for (const p of [
      'lab/../web',
      '../../../etc/passwd',
      'lab/key/..',
      'lab/%2e%2e/web',
      'lab/key/web/extra',
      'lab/key',
      'lab//web',
      '.lab/key/web',
      `lab/key/${'x'.repeat(101)}`,
    ]) {
      const a = await getResource(p, s.cookie);
      expect(a.status, p).toBe(404);
      expect(errorInfo(a).type, p).toBe(KBS_ERROR_TYPES.invalidRequestPath);
    }
    const put = await request((serve as Serve).port, 'PUT', '/kbs/v0/resource/lab/key/web', { body: 'x' });
    expect([put.status, put.headers.allow]).toEqual([405, 'GET']);
    const tooLongUrl = await request((serve as Serve).port, 'GET', `/kbs/v0/resource/${'a'.repeat(20_000)}`);
    expect(tooLongUrl.status).toBe(431);
    await stillServing();
  });

  it('garbage below HTTP (plain text on the TLS port, a TLS client speaking nonsense) only costs its own connection', async () => {
    const port = (serve as Serve).port;
    await new Promise<void>((resolve) => {
      const sock = tls.connect({ host: '127.0.0.1', port, ca: cert }, () => {
        sock.write('NOT HTTP AT ALL\r\n\r\n');
      });
      let got = '';
      sock.on('data', (c: Buffer) => {
        got += c.toString();
      });
      sock.on('close', () => {
        expect(got).toMatch(/^HTTP\/1\.1 400/);
        resolve();
      });
      sock.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => {
      const sock = net.connect(port, '127.0.0.1', () => sock.write('GET / HTTP/1.1\r\n\r\n'));
      sock.on('close', () => resolve());
      sock.on('error', () => undefined);
      sock.resume();
    });
    await stillServing();
  });

  it('admin changes reach the running broker without restart; a bad hand-edited policy keeps the old one', async () => {
    // Let the web set read the db resource too.
    await fsp.writeFile(
      path.join(tmp, 'policy2.json'),
      JSON.stringify({ schema: 'kata-ts/broker-policy/v1', resources: [{ path: 'lab/key/db', allow: ['db', 'web'] }] }),
    );
    expect((await cli(['policy', 'set', '--dir', dir, '--file', path.join(tmp, 'policy2.json')])).code).toBe(0);
    const s = await auth();
    const round = await attestation(pod, s.nonce, s.extra, DOC);
    expect((await post('/kbs/v0/attest', round.body, { cookie: s.cookie })).status).toBe(200);
    const db = await getResource('lab/key/db', s.cookie);
    expect(db.status, db.body).toBe(200);
    expect(Buffer.from(await decryptResource(JSON.parse(db.body), round.privateKey)).toString()).toBe(DB_SECRET);
    expect((await getResource('lab/key/web', s.cookie)).status).toBe(403);

    // An operator breaks policy.json by hand: the broker keeps the policy it had and says why.
    await fsp.writeFile(path.join(dir, 'policy.json'), '{"schema": "kata-ts/broker-policy/v1", "resources": [{"path": "lab/key/web"}]}');
    expect((await getResource('lab/key/db', s.cookie)).status).toBe(200);
    const kept = (await decisions()).filter((l) => l.event === 'config' && l.outcome === 'kept').at(-1);
    expect(kept).toMatchObject({ what: 'policy', why: expect.stringContaining("/resources/0 must have required property 'allow'") });

    // The resource deleted through the CLI is gone for the running broker at once.
    expect((await cli(['resource', 'delete', 'lab/key/db', '--dir', dir])).code).toBe(0);
    expect((await getResource('lab/key/db', s.cookie)).status).toBe(404);
    // A reference set deleted: new sessions no longer match it.
    expect((await cli(['reference', 'delete', 'web', '--dir', dir])).code).toBe(0);
    const t = await auth();
    const r2 = await attestation(pod, t.nonce, t.extra, DOC);
    const refused = await post('/kbs/v0/attest', r2.body, { cookie: t.cookie });
    expect([refused.status, errorInfo(refused).detail]).toEqual([401, expect.stringContaining('matched no reference set: db: tpm_pcr9')]);

    const log = await cli(['log', '--dir', dir]);
    expect(log.code).toBe(0);
    expect(log.stdout.split('\n').filter((l) => l !== '').length).toBe((await decisions()).length);
    await stillServing();
  });
});
