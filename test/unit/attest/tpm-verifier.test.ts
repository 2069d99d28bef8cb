/**
 * The tpm verifier's logic (src/attest/tpm-verifier.ts) on evidence made in-process: a stand-in
 * TPM made of node:crypto (an ECC P-256 attestation key, TPMS_ATTEST and TPMT_SIGNATURE marshalled
 * as a TPM does, a crypto-agile event log and the PCR values it replays to) and an EK certificate
 * from a CA made with openssl in a temporary dir. The stand-in does not activate the credential:
 * it takes the secret from the session state (the real activation by a real swtpm is
 * test/integration/attest/tpm-verifier.test.ts's). Each check is shown failing on its own, with
 * the field named.
 */
import { execFileSync } from 'node:child_process';
import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type BankName, digestsOf, type EncodeEvent, encodeEventLog, parseEventLog, replayEventLog } from '../../../src/attest/eventlog.js';
import {
  credentialProof,
  encodeTpmEvidence,
  encodeTpmRequestParams,
  parseTpmChallengeParams,
  type TpmEvidence,
  tpmQuoteNonce,
} from '../../../src/attest/tpm-evidence.js';
import { checkEkChain, parseCaBundle, type TpmSessionState, tpmVerifier } from '../../../src/attest/tpm-verifier.js';
import type { AttestFailure, EvidenceVerifier, VerifyInput, VerifyResult } from '../../../src/attest/verifier.js';
import { qualifiedName } from '../../../src/measure/quote.js';
import { thrown } from '../../helpers/kata-error.js';

const DOC = Buffer.from(
  'version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n"aa.toml" = \'\'\'\n[token_configs.kbs]\nurl = "https://broker"\n\'\'\'\n',
);

let work = '';
const pki = { caPem: '', ekPem: '', otherCaPem: '', otherEkPem: '', expiredCaPem: '' };

function openssl(args: string[]): void {
  execFileSync('openssl', args, { cwd: work, stdio: ['ignore', 'ignore', 'pipe'] });
}

function makeCa(name: string, days: number): string {
  openssl([
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.pem`,
    '-days',
    String(days),
    '-subj',
    `/CN=${name}`,
    '-addext',
    'basicConstraints=critical,CA:TRUE,pathlen:0',
    '-addext',
    'keyUsage=critical,keyCertSign',
  ]);
  return readFileSync(path.join(work, `${name}.pem`), 'utf8');
}

function makeEk(name: string, ca: string): string {
  openssl(['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', `${name}.key`]);
  openssl(['req', '-new', '-key', `${name}.key`, '-subj', `/CN=${name}`, '-out', `${name}.csr`]);
  openssl([
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    `${ca}.pem`,
    '-CAkey',
    `${ca}.key`,
    '-set_serial',
    '7',
    '-days',
    '3650',
    '-out',
    `${name}.pem`,
  ]);
  return readFileSync(path.join(work, `${name}.pem`), 'utf8');
}

beforeAll(() => {
  work = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-tpm-verifier-unit-'));
  pki.caPem = makeCa('ca', 3650);
  pki.ekPem = makeEk('ek', 'ca');
  pki.otherCaPem = makeCa('other-ca', 3650);
  pki.otherEkPem = makeEk('other-ek', 'other-ca');
});

afterAll(() => {
  if (work !== '') rmSync(work, { recursive: true, force: true });
});

const u16 = (n: number): Buffer => Buffer.from([n >> 8, n & 0xff]);
const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
};
const sized = (b: Buffer): Buffer => Buffer.concat([u16(b.length), b]);

/** A software stand-in of the guest's TPM: AK, PCRs from an event log plus the initdata extend, quotes. */
class SoftTpm {
  readonly ak: { privateKey: KeyObject; publicKey: KeyObject };
  readonly akPublic: Buffer;
  readonly akName: Buffer;
  readonly eventLog: Buffer;
  pcrs: Record<number, Buffer>;

  constructor(initdata: Buffer | null, restricted = true) {
    this.ak = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const jwk = this.ak.publicKey.export({ format: 'jwk' }) as { x: string; y: string };
    const attrs = restricted ? 0x00050472 : 0x00040472;
    this.akPublic = Buffer.concat([
      u16(0x0023),
      u16(0x000b),
      u32(attrs),
      sized(Buffer.alloc(0)),
      u16(0x0010),
      u16(0x0018),
      u16(0x000b),
      u16(0x0003),
      u16(0x0010),
      sized(Buffer.from(jwk.x, 'base64url')),
      sized(Buffer.from(jwk.y, 'base64url')),
    ]);
    this.akName = Buffer.concat([u16(0x000b), createHash('sha256').update(this.akPublic).digest()]);
    const banks: BankName[] = ['sha1', 'sha256'];
    const ev = (pcr: number, type: number, data: Buffer): EncodeEvent => ({ pcr, type, digests: digestsOf(banks, data), data });
    const sep = Buffer.alloc(4);
    this.eventLog = encodeEventLog(banks, [
      ev(0, 0x8, Buffer.from('EDK II\0', 'utf16le')),
      ev(0, 0x80000008, randomBytes(16)),
      ...[0, 1, 2, 3, 4, 5, 6, 7].map((p) => ev(p, 0x4, sep)),
      ev(4, 0x80000003, randomBytes(64)),
      ev(9, 0x6, Buffer.from('console=ttyS0 initrd=initrd\0', 'utf16le')),
    ]);
    const extra = initdata === null ? [] : [{ pcr: 8, digest: createHash('sha256').update(initdata).digest() }];
    this.pcrs = replayEventLog(parseEventLog(this.eventLog), 'sha256', extra);
  }

  quote(nonce: Buffer, pcrs: readonly number[]): { message: Buffer; signature: Buffer; pcrs: Buffer[] } {
    const bitmap = Buffer.alloc(3);
    for (const p of pcrs) bitmap[p >> 3] = (bitmap[p >> 3] ?? 0) | (1 << (p & 7));
    const values = [...pcrs].sort((a, b) => a - b).map((p) => this.pcrs[p] as Buffer);
    const message = Buffer.concat([
      u32(0xff544347),
      u16(0x8018),
      sized(qualifiedName(0x4000000b, this.akName)),
      sized(nonce),
      Buffer.alloc(17), // clockInfo
      Buffer.alloc(8), // firmwareVersion
      u32(1),
      u16(0x000b),
      Buffer.from([3]),
      bitmap,
      sized(createHash('sha256').update(Buffer.concat(values)).digest()),
    ]);
    const sig = sign('sha256', message, { key: this.ak.privateKey, dsaEncoding: 'ieee-p1363' });
    const signature = Buffer.concat([u16(0x0018), u16(0x000b), sized(sig.subarray(0, 32)), sized(sig.subarray(32))]);
    return { message, signature, pcrs: values };
  }
}

const PCRS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];

function runtimeData(nonce: string): Buffer {
  return Buffer.from(JSON.stringify({ nonce, 'tee-pubkey': { kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW', x: 'x', y: 'y' } }));
}

interface Round {
  verifier: EvidenceVerifier;
  tpm: SoftTpm;
  nonce: string;
  rd: Buffer;
  session: TpmSessionState;
  evidence: TpmEvidence;
  input: VerifyInput;
}

/** One honest round: Request, Challenge, evidence from `tpm` for that session. */
function round(o: { tpm?: SoftTpm; ekPem?: string; initdata?: Buffer | null } = {}): Round {
  const initdata = o.initdata === undefined ? DOC : o.initdata;
  const tpm = o.tpm ?? new SoftTpm(initdata);
  const verifier = tpmVerifier({ caBundlePem: `${pki.otherCaPem}${pki.caPem}` });
  const nonce = randomBytes(32).toString('base64');
  const ekPem = o.ekPem ?? pki.ekPem;
  const ch = verifier.challenge(encodeTpmRequestParams({ ekCertPem: ekPem, akPublic: tpm.akPublic }), nonce);
  expect(parseTpmChallengeParams(ch.extraParams).credentialBlob.length).toBeGreaterThan(32);
  const session = ch.sessionState as TpmSessionState;
  const rd = runtimeData(nonce);
  const q = tpm.quote(tpmQuoteNonce(rd), PCRS);
  const evidence: TpmEvidence = {
    akPublic: tpm.akPublic,
    quote: q,
    eventLog: tpm.eventLog,
    agentExtends: initdata === null ? [] : [{ pcr: 8, digestSha256: createHash('sha256').update(initdata).digest(), what: 'initdata' }],
    ekCertPem: ekPem,
    credentialProof: credentialProof(session.secret, rd),
  };
  const input: VerifyInput = {
    nonce,
    runtimeDataBytes: rd,
    initdataBody: initdata,
    evidence: encodeTpmEvidence(evidence),
    sessionState: session,
    nowMs: Date.now(),
  };
  return { verifier, tpm, nonce, rd, session, evidence, input };
}

function failures(r: VerifyResult): AttestFailure[] {
  expect(r.ok).toBe(false);
  return r.ok ? [] : r.failures;
}
const fields = (r: VerifyResult): string[] => failures(r).map((f) => f.field);

describe('tpm verifier: an honest round', () => {
  it('verifies; the claims are the quoted PCRs and the initdata digest', () => {
    const r = round();
    const res = r.verifier.verify(r.input);
    expect(res.ok, JSON.stringify(res)).toBe(true);
    if (!res.ok) return;
    expect(res.claims.tee).toBe('tpm');
    for (const p of PCRS) expect(res.claims.measurements[`tpm_pcr${p}`]).toBe(r.tpm.pcrs[p]?.toString('hex'));
    expect(Object.keys(res.claims.measurements).sort()).toEqual([...PCRS.map((p) => `tpm_pcr${p}`), 'init_data'].sort());
    expect(res.claims.measurements.init_data).toBe(createHash('sha256').update(DOC).digest('hex'));
    expect(res.claims.details.ek_cert_sha256).toBe(createHash('sha256').update(new X509Certificate(pki.ekPem).raw).digest('hex'));
    expect(res.claims.details.ak_name).toBe(r.tpm.akName.toString('hex'));
    expect(res.claims.details.ek_issuer).toBe('CN=ca');
    expect(res.claims.details.checks?.split(',')).toEqual([
      'ek_chain',
      'credential_activation',
      'quote_signature',
      'quote_nonce',
      'event_log_replay',
      'init_data',
    ]);
  });

  it('verifies without initdata when PCR 8 is at reset, and claims no init_data', () => {
    const r = round({ initdata: null });
    const res = r.verifier.verify(r.input);
    expect(res.ok, JSON.stringify(res)).toBe(true);
    if (res.ok) {
      expect(res.claims.measurements.init_data).toBeUndefined();
      expect(res.claims.measurements.tpm_pcr8).toBe('00'.repeat(32));
      expect(res.claims.details.init_data).toBe('none');
    }
  });

  it('verifies a TPM without a firmware log whose PCRs are at reset but for the agent extends', () => {
    const r = round();
    const tpm = r.tpm;
    const only8 = replayEventLog(null, 'sha256', [{ pcr: 8, digest: createHash('sha256').update(DOC).digest() }]);
    tpm.pcrs = only8;
    const q = tpm.quote(tpmQuoteNonce(r.rd), PCRS);
    const res = r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, quote: q, eventLog: Buffer.alloc(0) }) });
    expect(res.ok, JSON.stringify(res)).toBe(true);
  });
});

describe('tpm verifier: each check refuses on its own, naming the field', () => {
  it('evidence that does not decode: the field of the schema error', () => {
    const r = round();
    const ev = { ...(r.input.evidence as Record<string, unknown>), credential_proof: 'short' };
    expect(fields(r.verifier.verify({ ...r.input, evidence: ev }))).toEqual(['credential_proof']);
    expect(fields(r.verifier.verify({ ...r.input, evidence: 'x' }))).toEqual(['primary_evidence']);
  });

  it('a session without a tpm challenge', () => {
    const r = round();
    expect(fields(r.verifier.verify({ ...r.input, sessionState: { secret: r.session.secret } }))).toEqual(['session']);
  });

  it('another EK certificate than the challenged one (evidence of another pod in this session)', () => {
    const r = round();
    const other = round({ ekPem: pki.otherEkPem });
    // The other pod's whole evidence, shown in this session.
    const res = r.verifier.verify({ ...r.input, evidence: other.input.evidence });
    expect(fields(res)).toContain('ek_cert');
    expect(fields(res)).toContain('ak_public');
    expect(fields(res)).toContain('credential_proof');
  });

  it('another AK than the challenged one, quoting honestly for this nonce', () => {
    const r = round();
    const other = new SoftTpm(DOC);
    const q = other.quote(tpmQuoteNonce(r.rd), PCRS);
    const res = r.verifier.verify({
      ...r.input,
      evidence: encodeTpmEvidence({ ...r.evidence, akPublic: other.akPublic, quote: q, eventLog: other.eventLog }),
    });
    expect(fields(res)).toEqual(['ak_public']);
  });

  it('a wrong credential proof (the secret not known, or over other runtime data)', () => {
    const r = round();
    for (const proof of [randomBytes(32), credentialProof(r.session.secret, runtimeData('other'))]) {
      const res = r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, credentialProof: proof }) });
      expect(fields(res)).toEqual(['credential_proof']);
    }
  });

  it('a quote over another nonce, or replayed from an earlier session', () => {
    const r = round();
    const q = r.tpm.quote(tpmQuoteNonce(runtimeData('an old nonce')), PCRS);
    const res = r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, quote: q }) });
    expect(fields(res)).toEqual(['nonce']);
    const earlier = round({ tpm: r.tpm });
    const replay = earlier.verifier.verify({
      ...earlier.input,
      evidence: encodeTpmEvidence({ ...earlier.evidence, quote: r.evidence.quote }),
    });
    expect(fields(replay)).toEqual(['nonce']);
  });

  it('runtime data that do not name the session nonce', () => {
    const r = round();
    expect(fields(r.verifier.verify({ ...r.input, nonce: 'another' }))).toEqual(['nonce']);
  });

  it('a quote whose signature, PCR values or coverage is wrong', () => {
    const r = round();
    const message = Buffer.from(r.evidence.quote.message);
    message[message.length - 1] = (message[message.length - 1] ?? 0) ^ 1;
    const sig = failures(
      r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, quote: { ...r.evidence.quote, message } }) }),
    );
    expect(sig.map((f) => f.field)).toEqual(['tpm_quote']);
    expect(sig[0]?.reason).toMatch(/signature does not verify/);
    const pcrs = [...r.evidence.quote.pcrs];
    pcrs[4] = randomBytes(32);
    const vals = failures(
      r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, quote: { ...r.evidence.quote, pcrs } }) }),
    );
    expect(vals.map((f) => f.field)).toEqual(['tpm_quote']);
    expect(vals[0]?.reason).toMatch(/do not hash to the quote's PCR digest/);
    const short = failures(
      r.verifier.verify({
        ...r.input,
        evidence: encodeTpmEvidence({ ...r.evidence, quote: { ...r.evidence.quote, pcrs: pcrs.slice(1) } }),
      }),
    );
    expect(short[0]?.reason).toMatch(/selects 10 PCRs but 9 values/);
    const narrow = r.tpm.quote(tpmQuoteNonce(r.rd), [4, 8, 9]);
    const cover = failures(r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, quote: narrow }) }));
    expect(cover.map((f) => f.field)).toEqual(['tpm_quote']);
    expect(cover[0]?.reason).toMatch(/does not cover PCR 0, 1, 2, 3, 5, 6, 7/);
    const junk = failures(
      r.verifier.verify({
        ...r.input,
        evidence: encodeTpmEvidence({ ...r.evidence, quote: { ...r.evidence.quote, message: randomBytes(5) } }),
      }),
    );
    expect(junk.map((f) => f.field)).toEqual(['tpm_quote']);
  });

  it('an AK that is not a restricted signing key is refused at the challenge', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const err = thrown(() =>
      v.challenge(encodeTpmRequestParams({ ekCertPem: pki.ekPem, akPublic: new SoftTpm(null, false).akPublic }), 'n'),
    );
    expect(err.reason).toBe('ATTEST_MESSAGE_INVALID');
    expect(err.details?.field).toBe('ak_public');
    expect(err.kind).toBe('invalid');
  });

  it('an AK whose ADMIN role a policy could satisfy is refused at the challenge', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const ak = new SoftTpm(null).akPublic;
    const withAdminPolicy = Buffer.from(ak);
    withAdminPolicy.writeUInt32BE(withAdminPolicy.readUInt32BE(4) | 0x80, 4);
    // An authPolicy of 32 zero bytes: what a fresh policy session's digest is.
    const withPolicy = Buffer.concat([ak.subarray(0, 8), Buffer.from([0, 32]), Buffer.alloc(32), ak.subarray(10)]);
    for (const [bad, why] of [
      [withAdminPolicy, /adminWithPolicy set/],
      [withPolicy, /authPolicy of 32 bytes/],
    ] as const) {
      const err = thrown(() => v.challenge(encodeTpmRequestParams({ ekCertPem: pki.ekPem, akPublic: bad }), 'n'));
      expect(err.details?.field).toBe('ak_public');
      expect(err.message).toMatch(why);
    }
  });

  it('a tampered event log: the PCR it no longer explains, by name', () => {
    const r = round();
    const log = Buffer.from(r.evidence.eventLog);
    // The last event is PCR 9's; flip a byte of its sha256 digest (after pcr, type, count, sha1 digest, alg id).
    const last = parseEventLog(log).events.at(-1);
    if (last === undefined) throw new Error('no event');
    const at = last.offset + 12 + 2 + 20 + 2;
    log[at] = (log[at] ?? 0) ^ 0xff;
    const f = failures(r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, eventLog: log }) }));
    expect(f.map((x) => x.field)).toEqual(['event_log']);
    expect(f[0]?.reason).toMatch(/^tpm_pcr9: /);
    expect(f[0]?.expected).toBe(r.tpm.pcrs[9]?.toString('hex'));
    // Truncated: refused as a log, before any replay.
    const cut = failures(
      r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, eventLog: log.subarray(0, log.length - 3) }) }),
    );
    expect(cut.map((x) => x.field)).toEqual(['event_log']);
    expect(cut[0]?.reason).toMatch(/truncated/);
    // Left out: PCRs 0-7 and 9 unexplained.
    const none = failures(r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, eventLog: Buffer.alloc(0) }) }));
    expect(none.map((x) => x.reason.split(':')[0])).toEqual([
      'tpm_pcr0',
      'tpm_pcr1',
      'tpm_pcr2',
      'tpm_pcr3',
      'tpm_pcr4',
      'tpm_pcr5',
      'tpm_pcr6',
      'tpm_pcr7',
      'tpm_pcr9',
    ]);
  });

  it('agent extends that do not explain PCR 8', () => {
    const r = round();
    const res = r.verifier.verify({
      ...r.input,
      evidence: encodeTpmEvidence({ ...r.evidence, agentExtends: [{ pcr: 8, digestSha256: randomBytes(32), what: 'initdata' }] }),
    });
    expect(fields(res)).toEqual(['agent_extends']);
    expect(fields(r.verifier.verify({ ...r.input, evidence: encodeTpmEvidence({ ...r.evidence, agentExtends: [] }) }))).toEqual([
      'agent_extends',
    ]);
  });

  it('an init-data body that is not the one PCR 8 binds; none sent for an extended PCR 8; not an initdata document', () => {
    const r = round();
    const other = Buffer.from(DOC.toString().replace('broker', 'elsewhere'));
    const f = failures(r.verifier.verify({ ...r.input, initdataBody: other }));
    expect(f.map((x) => x.field)).toEqual(['init_data']);
    expect(f[0]?.actual).toBe(r.tpm.pcrs[8]?.toString('hex'));
    expect(fields(r.verifier.verify({ ...r.input, initdataBody: null }))).toEqual(['init_data']);
    const junk = failures(r.verifier.verify({ ...r.input, initdataBody: Buffer.from('not toml [') }));
    expect(junk.map((x) => x.field)).toEqual(['init_data']);
    expect(junk[0]?.reason).toMatch(/not an initdata document/);
  });

  it('an EK certificate no longer valid at verify time', () => {
    const r = round();
    const notAfter = Date.parse(new X509Certificate(pki.caPem).validTo);
    const f = failures(r.verifier.verify({ ...r.input, nowMs: notAfter + 1000 }));
    expect(f.map((x) => x.field)).toEqual(['ek_cert']);
    expect(f[0]?.reason).toMatch(/is not valid now/);
  });
});

describe('tpm verifier: the challenge', () => {
  it('refuses an EK certificate from another CA, naming ek_cert', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const err = thrown(() => v.challenge(encodeTpmRequestParams({ ekCertPem: pki.otherEkPem, akPublic: new SoftTpm(null).akPublic }), 'n'));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.kind).toBe('invalid');
    expect(err.details?.field).toBe('ek_cert');
    expect(err.message).toMatch(/not signed by any CA of the trusted bundle/);
  });

  it('refuses a CA certificate shown as the EK (self-signed, in the bundle)', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const err = thrown(() => v.challenge(encodeTpmRequestParams({ ekCertPem: pki.caPem, akPublic: new SoftTpm(null).akPublic }), 'n'));
    expect(err.details?.field).toBe('ek_cert');
    expect(err.message).toMatch(/is a CA certificate, not an endorsement key's/);
  });

  it('refuses malformed extra-params, naming the field', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const err = thrown(() => v.challenge({ ek_cert: pki.ekPem }, 'n'));
    expect(err.reason).toBe('ATTEST_MESSAGE_INVALID');
    expect(err.details?.field).toBe('ak_public');
  });

  it('checks validity with its clock', () => {
    const notAfter = Date.parse(new X509Certificate(pki.caPem).validTo);
    const v = tpmVerifier({ caBundlePem: pki.caPem, nowMs: () => notAfter + 1 });
    const err = thrown(() => v.challenge(encodeTpmRequestParams({ ekCertPem: pki.ekPem, akPublic: new SoftTpm(null).akPublic }), 'n'));
    expect(err.message).toMatch(/not valid now/);
    expect(checkEkChain(pki.ekPem, parseCaBundle(pki.caPem), Date.now()).ok).toBe(true);
  });

  it('each challenge seals a fresh secret', () => {
    const v = tpmVerifier({ caBundlePem: pki.caPem });
    const params = encodeTpmRequestParams({ ekCertPem: pki.ekPem, akPublic: new SoftTpm(null).akPublic });
    const a = v.challenge(params, 'n').sessionState as TpmSessionState;
    const b = v.challenge(params, 'n').sessionState as TpmSessionState;
    expect(a.secret.equals(b.secret)).toBe(false);
    expect(a.akName.equals(b.akName)).toBe(true);
  });

  it('a CA bundle without a usable CA does not make a verifier', () => {
    expect(thrown(() => tpmVerifier({ caBundlePem: '' })).reason).toBe('ATTEST_TRUST_INVALID');
    expect(thrown(() => tpmVerifier({ caBundlePem: pki.ekPem })).message).toMatch(/not a CA certificate/);
    expect(thrown(() => tpmVerifier({ caBundlePem: '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----' })).message).toMatch(
      /does not parse/,
    );
  });
});
