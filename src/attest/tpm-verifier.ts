/**
 * The verifier of tee "tpm" (pure apart from the clock it is given): a vtpm pod's swtpm, whose EK
 * certificate the node's TPM CA signed (docs/tpm.md), proves what its PCRs hold.
 *
 * At `/kbs/v0/auth` (challenge): the Request carries the EK certificate and the attestation key's
 * TPMT_PUBLIC. The certificate must chain to the CA bundle the broker trusts (issuer and
 * signature, both within their validity, the issuer a CA); the key must be a restricted signing
 * key (src/measure/quote.ts). The broker then makes a credential (TPM2_MakeCredential,
 * src/attest/credential.ts) of a fresh 32-byte secret for that EK and that AK's name: only the
 * TPM holding the EK's private key, with an object of exactly that name loaded, can open it.
 *
 * At `/kbs/v0/attest` (verify), every check names the field it is about:
 * - `ek_cert`, `ak_public`: the evidence's are the ones challenged (an evidence of another TPM
 *   presented in this session fails here), the certificate still within its validity;
 * - `credential_proof`: HMAC-SHA256(secret, runtimeDataBytes) — the guest's TPM opened the
 *   credential, so the AK lives beside the certified EK (an AK of another TPM shown with this
 *   EK's certificate cannot);
 * - `nonce`: the runtime data names this session's nonce and the quote's qualifying data is
 *   sha256(runtimeDataBytes), so a quote made for another nonce, or replayed, is refused;
 * - `tpm_quote`: the quote's signature by the AK, its signer, its PCR digest over the values
 *   given (verifyQuote), and that it covers PCRs 0-9;
 * - `event_log` / `agent_extends`: the firmware's log and the agent's own extends, replayed,
 *   give exactly the quoted values (a PCR they do not explain fails, naming it);
 * - `init_data`: PCR 8 holds one extend of sha256 of the Attestation's init-data body (what
 *   src/measure/initdata.ts vtpmPcr8 predicts), or its reset value when none was sent.
 * Claims: `tpm_pcrN` for every quoted PCR, `init_data` (sha256 of the body) when bound; details
 * say which EK, AK and CA, and which checks passed.
 *
 * Stateless: that one challenge answers one Attestation is the broker's to enforce (its session
 * nonce is taken once). What the activation relies on: the TPM opens a credential only for a
 * loaded object of the AK's name with its private part (a public-only object loaded with
 * TPM2_LoadExternal has no authValue to authorize it with; akPolicyRefusal makes sure no policy
 * can stand in for it), and the AK is fixedTPM and restricted, which parseAttestationKey requires.
 */
import { createHash, type KeyObject, randomBytes, X509Certificate } from 'node:crypto';
import { errorMessage, invalid, isKataError } from '../common/errors.js';
import { parseInitdataDocument, vtpmPcr8 } from '../measure/initdata.js';
import { ZERO_PCR_SHA256 } from '../measure/pcr.js';
import { parseAttestationKey, verifyQuote } from '../measure/quote.js';
import { ekPublicKeyFromCertificate, makeCredential } from './credential.js';
import { type EventLog, parseEventLog, replayEventLog } from './eventlog.js';
import {
  credentialProofMatches,
  encodeTpmChallengeParams,
  parseTpmEvidence,
  parseTpmRequestParams,
  TPM_EVIDENCE_PCRS,
  type TpmEvidence,
  tpmQuoteNonce,
} from './tpm-evidence.js';
import type { AttestClaims, AttestFailure, ChallengeParams, EvidenceVerifier, VerifyInput, VerifyResult } from './verifier.js';
import './reasons.js';

/** Bytes of the secret sealed in each credential (a sha256 EK takes up to 32). */
export const CREDENTIAL_SECRET_BYTES = 32;
/** The most CA certificates a bundle may hold (the node CA keeps two generations; several nodes). */
export const CA_BUNDLE_MAX_CERTS = 64;
const INITDATA_PCR = 8;

/** What `tpmVerifier` trusts, and the clock `challenge` checks validity with. */
export interface TpmVerifierOptions {
  /** PEM bundle of the EK CA certificates (`kata-ts tpm-ca show`): the only trust anchors. */
  caBundlePem: string;
  /** PCRs the quote must cover (default TPM_EVIDENCE_PCRS, 0-9). */
  requiredPcrs?: readonly number[];
  /** The clock of `challenge` (verify is handed its own); Date.now unless a test fixes it. */
  nowMs?: () => number;
}

/** What `challenge` keeps in the broker's session for `verify`: never sent. */
export class TpmSessionState {
  constructor(
    readonly secret: Buffer,
    readonly akPublic: Buffer,
    readonly akName: Buffer,
    /** sha256 of the EK certificate's DER. */
    readonly ekFingerprint: string,
    /** The subject of the CA certificate that signed it. */
    readonly ekIssuer: string,
  ) {}
}

/** A certificate's validity as milliseconds (node 20's X509Certificate gives strings). */
function validity(cert: X509Certificate): { fromMs: number; toMs: number } {
  return { fromMs: Date.parse(cert.validFrom), toMs: Date.parse(cert.validTo) };
}

const oneLine = (dn: string): string => dn.replaceAll('\n', ', ');

/** Splits and parses a PEM bundle. Throws ATTEST_TRUST_INVALID: a broker with no usable anchor must not start. */
export function parseCaBundle(pem: string): X509Certificate[] {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
  if (blocks.length === 0)
    throw invalid('ATTEST_TRUST_INVALID', 'the TPM CA bundle holds no PEM certificate', { details: { field: 'caBundlePem' } });
  if (blocks.length > CA_BUNDLE_MAX_CERTS)
    throw invalid('ATTEST_TRUST_INVALID', `the TPM CA bundle holds ${blocks.length} certificates, more than ${CA_BUNDLE_MAX_CERTS}`, {
      details: { field: 'caBundlePem' },
    });
  return blocks.map((b, i) => {
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(b);
    } catch (err) {
      throw invalid('ATTEST_TRUST_INVALID', `certificate ${i + 1} of the TPM CA bundle does not parse: ${errorMessage(err)}`, {
        details: { field: 'caBundlePem' },
      });
    }
    if (!cert.ca)
      throw invalid(
        'ATTEST_TRUST_INVALID',
        `certificate ${i + 1} of the TPM CA bundle (${oneLine(cert.subject)}) is not a CA certificate`,
        {
          details: { field: 'caBundlePem' },
        },
      );
    return cert;
  });
}

/** The outcome of checking an EK certificate against the bundle. */
export type EkChainResult = { ok: true; cert: X509Certificate; issuer: X509Certificate } | { ok: false; reason: string };

/**
 * Whether `ekCertPem` was issued and signed by one of `cas`, both within their validity at
 * `nowMs`. The EK certificate's TPM extensions (subject alternative name with the TPM's
 * manufacturer and model, the TCG's EK policy) are not judged: the CA that signed it vouches.
 */
export function checkEkChain(ekCertPem: string, cas: readonly X509Certificate[], nowMs: number): EkChainResult {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(ekCertPem);
  } catch (err) {
    return { ok: false, reason: `the EK certificate does not parse: ${errorMessage(err)}` };
  }
  // A CA certificate is no TPM's endorsement key, even one of the bundle's own.
  if (cert.ca) return { ok: false, reason: `the EK certificate (${oneLine(cert.subject)}) is a CA certificate, not an endorsement key's` };
  const issuer = cas.find((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey));
  if (issuer === undefined)
    return { ok: false, reason: `the EK certificate (issuer ${oneLine(cert.issuer)}) is not signed by any CA of the trusted bundle` };
  for (const [what, c] of [
    ['the EK certificate', cert],
    [`its CA certificate (${oneLine(issuer.subject)})`, issuer],
  ] as const) {
    const v = validity(c);
    if (!(nowMs >= v.fromMs && nowMs <= v.toMs))
      return { ok: false, reason: `${what} is not valid now (valid ${c.validFrom} to ${c.validTo})` };
  }
  return { ok: true, cert, issuer };
}

const fingerprint = (cert: X509Certificate): string => createHash('sha256').update(cert.raw).digest('hex');

/** The quoted PCR numbers of a TPMS_ATTEST, lowest first, read only far enough to map `tpm_quote.pcrs` onto them. */
function quotedPcrNumbers(attest: Buffer): { pcrs: number[]; extraData: Buffer } | string {
  let at = 0;
  const need = (n: number): boolean => at + n <= attest.length;
  const u16 = (): number | undefined => {
    if (!need(2)) return undefined;
    const v = attest.readUInt16BE(at);
    at += 2;
    return v;
  };
  const sized = (): Buffer | undefined => {
    const n = u16();
    if (n === undefined || !need(n)) return undefined;
    at += n;
    return attest.subarray(at - n, at);
  };
  if (!need(6)) return 'the quote is shorter than its header';
  at = 6; // magic, type: verifyQuote judges them
  if (sized() === undefined) return 'the quote is truncated in its signer name';
  const extraData = sized();
  if (extraData === undefined) return 'the quote is truncated in its qualifying data';
  at += 17 + 8; // clockInfo, firmwareVersion
  if (!need(4)) return 'the quote is truncated before its PCR selection';
  const banks = attest.readUInt32BE(at);
  at += 4;
  if (banks > 16) return `the quote selects ${banks} banks`;
  const pcrs: number[] = [];
  for (let b = 0; b < banks; b++) {
    if (!need(3)) return 'the quote is truncated in its PCR selection';
    at += 2;
    const size = attest.readUInt8(at++);
    if (!need(size)) return 'the quote is truncated in its PCR selection';
    for (let p = 0; p < size * 8; p++) if (((attest[at + (p >> 3)] ?? 0) >> (p & 7)) & 1) pcrs.push(p);
    at += size;
  }
  return { pcrs, extraData: Buffer.from(extraData) };
}

/** TPMA_OBJECT adminWithPolicy: the ADMIN role (which ActivateCredential asks of the AK) is then a policy's. */
const ATTR_ADMIN_WITH_POLICY = 0x00000080;

/**
 * Why the AK's public area would let a TPM that does not hold the AK's private part activate a
 * credential for it, or null. Activation asks for the AK's ADMIN role: with adminWithPolicy
 * clear that is its authValue, which an object loaded from its public part alone does not have;
 * with a policy (even an empty-looking one), a policy session could satisfy it for such a copy.
 * So: adminWithPolicy clear and no authPolicy, as the guest's AK template has.
 */
export function akPolicyRefusal(akPublic: Buffer): string | null {
  if (akPublic.length < 10) return 'the attestation key is too short to hold its attributes';
  const attrs = akPublic.readUInt32BE(4);
  const policyBytes = akPublic.readUInt16BE(8);
  if ((attrs & ATTR_ADMIN_WITH_POLICY) !== 0)
    return 'the attestation key has adminWithPolicy set: its activation could be authorized by a policy instead of the key itself';
  if (policyBytes !== 0) return `the attestation key has an authPolicy of ${policyBytes} bytes: it must have none`;
  return null;
}

function fail(failures: AttestFailure[], field: string, reason: string, expected?: string, actual?: string): void {
  failures.push({ field, reason, ...(expected === undefined ? {} : { expected }), ...(actual === undefined ? {} : { actual }) });
}

/** A refusal of `challenge`: kind invalid (the broker answers 400), reason and field named. */
function refuseRequest(field: string, message: string, refused: boolean): never {
  throw invalid(refused ? 'ATTEST_EVIDENCE_REFUSED' : 'ATTEST_MESSAGE_INVALID', message, { details: { field } });
}

/** The tpm verifier (see the file's comment). Throws ATTEST_TRUST_INVALID when the bundle holds no usable CA. */
export function tpmVerifier(options: TpmVerifierOptions): EvidenceVerifier {
  const cas = parseCaBundle(options.caBundlePem);
  const required = [...(options.requiredPcrs ?? TPM_EVIDENCE_PCRS)].sort((a, b) => a - b);
  const clock = options.nowMs ?? Date.now;

  return {
    tee: 'tpm',

    challenge(requestExtraParams: unknown, _nonce: string): ChallengeParams {
      const req = parseTpmRequestParams(requestExtraParams);
      const chain = checkEkChain(req.ekCertPem, cas, clock());
      if (!chain.ok) refuseRequest('ek_cert', chain.reason, true);
      let ekKey: KeyObject;
      try {
        ekKey = ekPublicKeyFromCertificate(chain.cert);
      } catch (err) {
        refuseRequest('ek_cert', errorMessage(err), true);
      }
      let akName: Buffer;
      try {
        akName = parseAttestationKey(req.akPublic).name;
      } catch (err) {
        refuseRequest('ak_public', `the attestation key is not one a quote is accepted from: ${errorMessage(err)}`, false);
      }
      const policyRefusal = akPolicyRefusal(req.akPublic);
      if (policyRefusal !== null) refuseRequest('ak_public', policyRefusal, false);
      const secret = randomBytes(CREDENTIAL_SECRET_BYTES);
      const made = makeCredential(ekKey, akName, secret);
      return {
        extraParams: { ...encodeTpmChallengeParams(made) },
        sessionState: new TpmSessionState(secret, req.akPublic, akName, fingerprint(chain.cert), oneLine(chain.issuer.subject)),
      };
    },

    verify(input: VerifyInput): VerifyResult {
      const session = input.sessionState;
      if (!(session instanceof TpmSessionState))
        return { ok: false, failures: [{ field: 'session', reason: 'the session holds no tpm challenge: start again at /kbs/v0/auth' }] };
      let ev: TpmEvidence;
      try {
        ev = parseTpmEvidence(input.evidence);
      } catch (err) {
        const field = isKataError(err) && typeof err.details?.field === 'string' ? err.details.field : 'primary_evidence';
        return { ok: false, failures: [{ field, reason: errorMessage(err) }] };
      }
      const failures: AttestFailure[] = [];
      const passed: string[] = [];

      // The TPM that was challenged: same EK certificate, same AK, the certificate still valid.
      let ekOk = false;
      let ekCert: X509Certificate | undefined;
      try {
        ekCert = new X509Certificate(ev.ekCertPem);
      } catch (err) {
        fail(failures, 'ek_cert', `the EK certificate does not parse: ${errorMessage(err)}`);
      }
      if (ekCert !== undefined) {
        const fp = fingerprint(ekCert);
        if (fp !== session.ekFingerprint)
          fail(failures, 'ek_cert', 'the EK certificate is not the one this session was challenged with', session.ekFingerprint, fp);
        else {
          const chain = checkEkChain(ev.ekCertPem, cas, input.nowMs);
          if (chain.ok) ekOk = true;
          else fail(failures, 'ek_cert', chain.reason);
        }
      }
      if (ekOk) passed.push('ek_chain');
      const akOk = ev.akPublic.equals(session.akPublic);
      if (!akOk) fail(failures, 'ak_public', 'the attestation key is not the one this session was challenged with');

      // The AK's TPM opened the credential made for this EK and this AK.
      if (credentialProofMatches(ev.credentialProof, session.secret, input.runtimeDataBytes)) passed.push('credential_activation');
      else
        fail(
          failures,
          'credential_proof',
          "the credential proof is not HMAC-SHA256 of the runtime data with the challenge's secret: the TPM that quoted did not activate this session's credential",
        );

      // The runtime data names this session's nonce (the broker checks it too; the bytes are what the quote binds).
      let rdNonce: unknown;
      try {
        rdNonce = (JSON.parse(input.runtimeDataBytes.toString('utf8')) as { nonce?: unknown }).nonce;
      } catch {
        rdNonce = undefined;
      }
      if (rdNonce !== input.nonce) fail(failures, 'nonce', "the runtime data does not carry this session's nonce");

      // The quote: signed by this AK, over the values given, for these runtime data.
      const expectedNonce = tpmQuoteNonce(input.runtimeDataBytes);
      const shape = quotedPcrNumbers(ev.quote.message);
      let quoted: Record<number, string> | undefined;
      if (typeof shape === 'string') fail(failures, 'tpm_quote', shape);
      else if (shape.pcrs.length !== ev.quote.pcrs.length)
        fail(failures, 'tpm_quote', `the quote selects ${shape.pcrs.length} PCRs but ${ev.quote.pcrs.length} values were given`);
      else {
        const pcrValues: Record<number, Buffer> = {};
        shape.pcrs.forEach((p, i) => {
          pcrValues[p] = ev.quote.pcrs[i] as Buffer;
        });
        try {
          // Checked against the quote's own qualifying data here, and that against the expected
          // nonce below: a quote for another nonce is then named as such, not as a bad signature.
          const v = verifyQuote(
            { attest: ev.quote.message, signature: ev.quote.signature, akPublic: ev.akPublic, pcrValues },
            shape.extraData,
          );
          passed.push('quote_signature');
          if (!shape.extraData.equals(expectedNonce))
            fail(
              failures,
              'nonce',
              "the quote's qualifying data is not sha256 of this session's runtime data: it was made for another nonce or key",
              expectedNonce.toString('hex'),
              shape.extraData.toString('hex'),
            );
          else passed.push('quote_nonce');
          const missing = required.filter((p) => v.pcrValues[p] === undefined);
          if (missing.length > 0) fail(failures, 'tpm_quote', `the quote does not cover PCR ${missing.join(', ')}`);
          quoted = v.pcrValues;
        } catch (err) {
          fail(failures, 'tpm_quote', errorMessage(err));
        }
      }

      // The event log and the agent's extends explain every quoted value.
      let log: EventLog | null = null;
      let logOk = true;
      if (ev.eventLog.length > 0) {
        try {
          log = parseEventLog(ev.eventLog);
        } catch (err) {
          logOk = false;
          fail(failures, 'event_log', errorMessage(err));
        }
      }
      if (quoted !== undefined && logOk) {
        try {
          const extra = ev.agentExtends.map((x) => ({ pcr: x.pcr, digest: x.digestSha256 }));
          const replayed = replayEventLog(log, 'sha256', extra);
          const byAgent = new Set(ev.agentExtends.map((x) => x.pcr));
          const byLog = new Set(log?.events.map((e) => e.pcr) ?? []);
          let all = true;
          for (const [p, value] of Object.entries(quoted)) {
            const pcr = Number(p);
            const r = replayed[pcr]?.toString('hex');
            if (r === value) continue;
            all = false;
            // The agent's PCR (8) and any its extends touch are its to explain, unless the firmware logged there too.
            const field = (byAgent.has(pcr) || pcr === INITDATA_PCR) && !byLog.has(pcr) ? 'agent_extends' : 'event_log';
            fail(
              failures,
              field,
              `tpm_pcr${pcr}: the event log${byAgent.has(pcr) ? ' and the agent extends' : ''} replay to another value than the quoted one`,
              value,
              r,
            );
          }
          if (all) passed.push('event_log_replay');
        } catch (err) {
          fail(failures, 'event_log', errorMessage(err));
        }
      }

      // PCR 8: the initdata binding.
      let initData: string | undefined;
      if (quoted !== undefined) {
        const pcr8 = quoted[INITDATA_PCR];
        if (pcr8 === undefined) fail(failures, 'init_data', 'the quote does not cover PCR 8, which binds the initdata');
        else if (input.initdataBody !== null) {
          try {
            const expected = vtpmPcr8(parseInitdataDocument(input.initdataBody));
            if (expected.value.toString('hex') !== pcr8)
              fail(failures, 'init_data', 'PCR 8 is not one extend of sha256 of the init-data sent', expected.value.toString('hex'), pcr8);
            else {
              initData = expected.digestSha256.toString('hex');
              passed.push('init_data');
            }
          } catch (err) {
            fail(failures, 'init_data', `the init-data body is not an initdata document: ${errorMessage(err)}`);
          }
        } else if (pcr8 !== ZERO_PCR_SHA256.toString('hex'))
          fail(failures, 'init_data', 'PCR 8 was extended but no init-data was sent to bind it', ZERO_PCR_SHA256.toString('hex'), pcr8);
        else passed.push('init_data_none');
      }

      if (failures.length > 0 || quoted === undefined) {
        if (failures.length === 0) fail(failures, 'tpm_quote', 'the quote was not verified');
        return { ok: false, failures };
      }
      const measurements: Record<string, string> = {};
      for (const [p, v] of Object.entries(quoted)) measurements[`tpm_pcr${p}`] = v;
      if (initData !== undefined) measurements.init_data = initData;
      const claims: AttestClaims = {
        tee: 'tpm',
        measurements,
        details: {
          ek_cert_sha256: session.ekFingerprint,
          ek_issuer: session.ekIssuer,
          ak_name: session.akName.toString('hex'),
          init_data: initData === undefined ? 'none' : 'bound',
          event_log_events: String(log?.events.length ?? 0),
          checks: passed.join(','),
        },
      };
      return { ok: true, claims };
    },
  };
}
