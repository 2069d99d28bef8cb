/**
 * The tpm verifier (src/attest/tpm-verifier.ts) against real software TPMs: each "pod" is a real
 * swtpm whose state and EK certificate swtpm_setup made with a node CA made by src/tpm/ca.ts
 * (test/helpers/tpm-evidence-tool.ts; the firmware's measurements are the tool's stand-in, named
 * so there), driven by the guest's own TPM code (guest/agent/tpm.ts: EK certificate from NV,
 * attestation key, TPM2_ActivateCredential, TPM2_Quote) and the agent's initdata step.
 *
 * A good round verifies and its claims equal the PCRs read from the TPM; then every attack is
 * refused with the field it concerns named:
 *  - a quote replayed from an earlier session (old nonce), a quote made over another nonce: `nonce`;
 *  - an AK not bound to the EK (another swtpm's AK shown with this EK's certificate): neither TPM
 *    can activate the credential, so there is no proof: `credential_proof`; nor can the EK's TPM
 *    after loading the other AK from its public part (TPM2_LoadExternal, raw commands), while the
 *    same raw steps with its own AK do activate;
 *  - an EK certificate from another CA: refused at the challenge, `ek_cert`;
 *  - the whole evidence of another pod (another swtpm, same CA) presented in this session:
 *    `ek_cert`, `ak_public`, `credential_proof`;
 *  - a tampered event log: `event_log`, naming the PCR it no longer explains;
 *  - a wrong credential proof: `credential_proof`;
 *  - an init-data body that is not the one PCR 8 was extended with: `init_data`.
 * And with the events src/measure/vtpm.ts predicts for a launch as the stand-in firmware's, the
 * claims equal the predicted PCRs 4, 7, 8 and 9 (what a broker's reference set holds).
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  activateCredentialCommand,
  akTemplate,
  createPrimaryCommand,
  decodeResponseCode,
  ekTemplate,
  flushContextCommand,
  parseResponseHeader,
  policySecretCommand,
  startPolicySessionCommand,
  TPM_RH_ENDORSEMENT,
  TPM_RH_NULL,
} from '../../../guest/agent/tpm.js';
import { parseEventLog } from '../../../src/attest/eventlog.js';
import {
  encodeTpmEvidence,
  parseTpmEvidence,
  TPM_EVIDENCE_PCRS,
  type TpmEvidenceJson,
  tpmQuoteNonce,
} from '../../../src/attest/tpm-evidence.js';
import { tpmVerifier } from '../../../src/attest/tpm-verifier.js';
import type { AttestFailure, ChallengeParams, EvidenceVerifier, VerifyInput, VerifyResult } from '../../../src/attest/verifier.js';
import { q35RamBelow4GiBBytes } from '../../../src/measure/bzimage.js';
import { predictVtpm } from '../../../src/measure/vtpm.js';
import { rejection, thrown } from '../../helpers/kata-error.js';
import { makeToolCa, type ToolCa, TpmEvidenceTool, teeRuntimeData, tpmEvidenceToolMissing } from '../../helpers/tpm-evidence-tool.js';

const DOC = Buffer.from(
  'version = "0.1.0"\nalgorithm = "sha384"\n\n[data]\n"aa.toml" = \'\'\'\n[token_configs.kbs]\nurl = "https://broker.test:8443"\n\'\'\'\n',
);
const missing = tpmEvidenceToolMissing();
const GUEST_KERNEL = process.env.KATA_TS_GUEST_DIR ? `${process.env.KATA_TS_GUEST_DIR}/vmlinuz` : '/usr/local/share/kata-ts/guest/vmlinuz';
const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';

describe.skipIf(missing.length > 0)('tpm verifier with real swtpms', () => {
  let ca: ToolCa | undefined;
  let otherCa: ToolCa | undefined;
  const tools: TpmEvidenceTool[] = [];
  let pod: TpmEvidenceTool;
  let otherPod: TpmEvidenceTool;
  let foreign: TpmEvidenceTool;
  let verifier: EvidenceVerifier;

  beforeAll(async () => {
    ca = await makeToolCa();
    otherCa = await makeToolCa();
    pod = await TpmEvidenceTool.start({ ca, initdata: DOC });
    tools.push(pod);
    otherPod = await TpmEvidenceTool.start({ ca, initdata: DOC });
    tools.push(otherPod);
    foreign = await TpmEvidenceTool.start({ ca: otherCa, initdata: DOC });
    tools.push(foreign);
    verifier = tpmVerifier({ caBundlePem: ca.bundlePem });
  });

  afterAll(async () => {
    for (const t of tools) await t.close();
    await ca?.cleanup();
    await otherCa?.cleanup();
  });

  /** One session: challenge for `requester`'s Request, runtime data for its nonce. */
  function session(requester: TpmEvidenceTool = pod): {
    ch: ChallengeParams;
    nonce: string;
    rd: Buffer;
    input: (evidence: unknown, over?: Partial<VerifyInput>) => VerifyInput;
  } {
    const nonce = randomBytes(32).toString('base64');
    const ch = verifier.challenge(requester.requestExtraParams(), nonce);
    const rd = teeRuntimeData(nonce).bytes;
    return {
      ch,
      nonce,
      rd,
      input: (evidence, over = {}) => ({
        nonce,
        runtimeDataBytes: rd,
        initdataBody: DOC,
        evidence,
        sessionState: ch.sessionState,
        nowMs: Date.now(),
        ...over,
      }),
    };
  }

  const failures = (r: VerifyResult): AttestFailure[] => {
    expect(r.ok, 'the evidence was accepted').toBe(false);
    return r.ok ? [] : r.failures;
  };
  const fields = (r: VerifyResult): string[] => failures(r).map((f) => f.field);

  it('a good round verifies; its claims are the PCRs read from the TPM', async () => {
    const s = session();
    const evidence = await pod.evidence(s.ch.extraParams, s.rd);
    const res = verifier.verify(s.input(evidence));
    expect(res.ok, JSON.stringify(res)).toBe(true);
    if (!res.ok) return;
    const read = await pod.pcrs();
    expect(Object.keys(read).map(Number)).toEqual([...TPM_EVIDENCE_PCRS]);
    for (const p of TPM_EVIDENCE_PCRS) expect(res.claims.measurements[`tpm_pcr${p}`], `PCR ${p}`).toBe(read[p]);
    expect(res.claims.measurements.init_data).toBe(pod.agentExtends[0]?.digestSha256.toString('hex'));
    expect(res.claims.details.ak_name).toBe(pod.akName.toString('hex'));
    expect(res.claims.details.checks).toBe('ek_chain,credential_activation,quote_signature,quote_nonce,event_log_replay,init_data');
    // PCR 8 is not zero (the agent extended it) and PCR 4 is the stand-in firmware's, not reset.
    expect(read[8]).not.toBe('00'.repeat(32));
    expect(read[4]).not.toBe('00'.repeat(32));
  });

  it('a replayed quote (an earlier session, its old nonce) is refused: nonce', async () => {
    const old = session();
    const oldEvidence = parseTpmEvidence(await pod.evidence(old.ch.extraParams, old.rd));
    const now = session();
    const secret = await pod.activate(now.ch.extraParams);
    const fresh = parseTpmEvidence(await pod.evidence(now.ch.extraParams, now.rd));
    expect(secret.length).toBe(32);
    // The attacker has this session's credential proof but only the old quote.
    const res = verifier.verify(now.input(encodeTpmEvidence({ ...fresh, quote: oldEvidence.quote })));
    expect(fields(res)).toEqual(['nonce']);
    // And the whole old evidence, in the new session: the old proof and the old quote.
    expect(fields(verifier.verify(now.input(encodeTpmEvidence(oldEvidence))))).toEqual(['credential_proof', 'nonce']);
  });

  it('a quote made over another nonce is refused: nonce', async () => {
    const s = session();
    const good = parseTpmEvidence(await pod.evidence(s.ch.extraParams, s.rd));
    const q = await pod.quote(tpmQuoteNonce(teeRuntimeData(s.nonce).bytes));
    const quote = { message: q.attest, signature: q.signature, pcrs: TPM_EVIDENCE_PCRS.map((p) => q.pcrValues[p] as Buffer) };
    const f = failures(verifier.verify(s.input(encodeTpmEvidence({ ...good, quote }))));
    expect(f.map((x) => x.field)).toEqual(['nonce']);
    expect(f[0]?.reason).toMatch(/qualifying data is not sha256 of this session's runtime data/);
  });

  it("an AK not bound to the EK (another swtpm's AK with this EK's certificate) cannot activate: credential_proof", async () => {
    const nonce = randomBytes(32).toString('base64');
    const ch = verifier.challenge({ ...pod.requestExtraParams(), ak_public: otherPod.akPublic.toString('base64') }, nonce);
    // The TPM with the EK has no object of the other AK's name; the TPM with the AK lacks the EK.
    expect((await rejection(pod.activate(ch.extraParams))).reason).toBe('TPM_CREDENTIAL_REFUSED');
    expect((await rejection(otherPod.activate(ch.extraParams))).reason).toBe('TPM_CREDENTIAL_REFUSED');
    const rd = teeRuntimeData(nonce).bytes;
    const q = await otherPod.quote(tpmQuoteNonce(rd));
    const forged: TpmEvidenceJson = encodeTpmEvidence({
      akPublic: otherPod.akPublic,
      quote: { message: q.attest, signature: q.signature, pcrs: TPM_EVIDENCE_PCRS.map((p) => q.pcrValues[p] as Buffer) },
      eventLog: otherPod.eventLog,
      agentExtends: otherPod.agentExtends,
      ekCertPem: pod.ekCertPem,
      credentialProof: randomBytes(32),
    });
    const res = verifier.verify({
      nonce,
      runtimeDataBytes: rd,
      initdataBody: DOC,
      evidence: forged,
      sessionState: ch.sessionState,
      nowMs: Date.now(),
    });
    expect(fields(res)).toEqual(['credential_proof']);
  });

  /**
   * Credential activation by raw commands in `tool`'s TPM: the EK, a policy session satisfying its
   * policy, and the object `loadAk` puts in the TPM as the AK. The response code and its name.
   */
  async function rawActivation(
    tool: TpmEvidenceTool,
    loadAk: () => Promise<number>,
    challenge: unknown,
  ): Promise<{ code: number; name: string }> {
    const { credential_blob, encrypted_secret } = challenge as { credential_blob: string; encrypted_secret: string };
    const handles: number[] = [];
    const ok = (r: Buffer, what: string): Buffer => {
      const h = parseResponseHeader(r, what);
      if (h.code !== 0) throw new Error(`${what} answered 0x${h.code.toString(16)}`);
      return h.body;
    };
    try {
      handles.push(await loadAk());
      handles.push(ok(await tool.sendRaw(createPrimaryCommand(TPM_RH_ENDORSEMENT, ekTemplate())), 'CreatePrimary(EK)').readUInt32BE(0));
      const session = ok(await tool.sendRaw(startPolicySessionCommand(randomBytes(32))), 'StartAuthSession').readUInt32BE(0);
      handles.push(session);
      ok(await tool.sendRaw(policySecretCommand(session)), 'PolicySecret');
      const answer = await tool.sendRaw(
        activateCredentialCommand(
          handles[0] as number,
          handles[1] as number,
          session,
          Buffer.from(credential_blob, 'base64'),
          Buffer.from(encrypted_secret, 'base64'),
        ),
      );
      const { code } = parseResponseHeader(answer, 'ActivateCredential');
      return { code, name: decodeResponseCode(code).name ?? `0x${code.toString(16)}` };
    } finally {
      for (const h of handles.reverse()) await tool.sendRaw(flushContextCommand(h)).catch(() => undefined);
    }
  }

  it("the EK's TPM cannot activate for another TPM's AK loaded from its public part; with its own AK it can", async () => {
    const forOther = verifier.challenge({ ...pod.requestExtraParams(), ak_public: otherPod.akPublic.toString('base64') }, 'n');
    // TPM2_LoadExternal: no private part, the other AK's public area, no hierarchy.
    const loadExternal = async (): Promise<number> => {
      const pub = otherPod.akPublic;
      const params = Buffer.concat([
        Buffer.from([0, 0]),
        Buffer.from([pub.length >> 8, pub.length & 0xff]),
        pub,
        Buffer.from([0x40, 0, 0, 7]),
      ]);
      const cmd = Buffer.alloc(10);
      cmd.writeUInt16BE(0x8001, 0);
      cmd.writeUInt32BE(10 + params.length, 2);
      cmd.writeUInt32BE(0x167, 6);
      const r = await pod.sendRaw(Buffer.concat([cmd, params]));
      const h = parseResponseHeader(r, 'LoadExternal');
      expect(h.code, 'LoadExternal of a public area').toBe(0);
      return h.body.readUInt32BE(0);
    };
    expect(TPM_RH_NULL).toBe(0x40000007);
    const refused = await rawActivation(pod, loadExternal, forOther.extraParams);
    // TPM_RC_AUTH_UNAVAILABLE: a public-only object has no authValue for the ADMIN role activation asks.
    expect(refused.code, `ActivateCredential answered ${refused.name}`).toBe(0x12f);
    // The same steps with the TPM's own AK (made as the guest makes it) and a credential for it succeed.
    const forOwn = verifier.challenge(pod.requestExtraParams(), 'n');
    const ownAk = async (): Promise<number> => {
      const r = await pod.sendRaw(createPrimaryCommand(TPM_RH_ENDORSEMENT, akTemplate()));
      const h = parseResponseHeader(r, 'CreatePrimary(AK)');
      expect(h.code).toBe(0);
      return h.body.readUInt32BE(0);
    };
    expect(await rawActivation(pod, ownAk, forOwn.extraParams)).toEqual({ code: 0, name: '0x0' });
  });

  it('an EK certificate from another CA is refused at the challenge: ek_cert', () => {
    const err = thrown(() => verifier.challenge(foreign.requestExtraParams(), 'n'));
    expect(err.reason).toBe('ATTEST_EVIDENCE_REFUSED');
    expect(err.details?.field).toBe('ek_cert');
    expect(err.message).toMatch(/not signed by any CA of the trusted bundle/);
  });

  it("another pod's evidence presented in this session is refused: ek_cert, ak_public, credential_proof", async () => {
    const mine = session(pod);
    const theirs = session(otherPod);
    // The other pod answers its own challenge honestly, over this session's runtime data.
    const evidence = await otherPod.evidence(theirs.ch.extraParams, mine.rd);
    expect(verifier.verify(theirs.input(evidence, { nonce: mine.nonce, runtimeDataBytes: mine.rd })).ok).toBe(true);
    expect(fields(verifier.verify(mine.input(evidence)))).toEqual(['ek_cert', 'ak_public', 'credential_proof']);
  });

  it('a tampered event log is refused: event_log, naming the PCR', async () => {
    const s = session();
    const good = parseTpmEvidence(await pod.evidence(s.ch.extraParams, s.rd));
    const log = Buffer.from(good.eventLog);
    const kernel = parseEventLog(log).events.find((e) => e.typeName === 'EV_EFI_BOOT_SERVICES_APPLICATION');
    if (kernel === undefined) throw new Error('the stand-in log has no kernel event');
    // Its sha256 digest follows pcr, type, count and the algorithm id.
    const at = kernel.offset + 12 + 2;
    log[at] = (log[at] ?? 0) ^ 0x01;
    const f = failures(verifier.verify(s.input(encodeTpmEvidence({ ...good, eventLog: log }))));
    expect(f.map((x) => x.field)).toEqual(['event_log']);
    expect(f[0]?.reason).toMatch(/^tpm_pcr4: /);
    expect(f[0]?.expected).toBe((await pod.pcrs([4]))[4]);
  });

  it('a TPM whose PCR moved after boot no longer matches its log: event_log', async () => {
    const tool = await TpmEvidenceTool.start({ ca, initdata: DOC });
    tools.push(tool);
    await tool.extend(9, randomBytes(32));
    const nonce = randomBytes(32).toString('base64');
    const ch = verifier.challenge(tool.requestExtraParams(), nonce);
    const rd = teeRuntimeData(nonce).bytes;
    const f = failures(
      verifier.verify({
        nonce,
        runtimeDataBytes: rd,
        initdataBody: DOC,
        evidence: await tool.evidence(ch.extraParams, rd),
        sessionState: ch.sessionState,
        nowMs: Date.now(),
      }),
    );
    expect(f.map((x) => `${x.field} ${x.reason.split(':')[0]}`)).toEqual(['event_log tpm_pcr9']);
  });

  it('a wrong credential proof is refused: credential_proof', async () => {
    const s = session();
    const good = parseTpmEvidence(await pod.evidence(s.ch.extraParams, s.rd));
    expect(fields(verifier.verify(s.input(encodeTpmEvidence({ ...good, credentialProof: randomBytes(32) }))))).toEqual([
      'credential_proof',
    ]);
  });

  it('an init-data body that does not match PCR 8 is refused: init_data', async () => {
    const s = session();
    const evidence = await pod.evidence(s.ch.extraParams, s.rd);
    const other = Buffer.from(DOC.toString().replace('broker.test', 'evil.test'));
    const f = failures(verifier.verify(s.input(evidence, { initdataBody: other })));
    expect(f.map((x) => x.field)).toEqual(['init_data']);
    expect(f[0]?.actual).toBe((await pod.pcrs([8]))[8]);
    expect(fields(verifier.verify(s.input(evidence, { initdataBody: null })))).toEqual(['init_data']);
  });

  it.skipIf(!existsSync(GUEST_KERNEL) || !existsSync(OVMF_VARS))(
    "with the launch src/measure predicts as the stand-in firmware's events, the claims are the predicted PCRs 4, 7, 8 and 9",
    async () => {
      const prediction = predictVtpm({
        kernel: readFileSync(GUEST_KERNEL),
        initrd: Buffer.from('a stand-in initrd'),
        cmdline: 'console=ttyS0 quiet',
        ramBelow4GiBBytes: q35RamBelow4GiBBytes(512 * 1024 * 1024),
        initdataDigestSha256: createHash('sha256').update(DOC).digest(),
        ovmfVars: readFileSync(OVMF_VARS),
      });
      expect(Object.keys(prediction.pcrs).map(Number)).toEqual([4, 7, 8, 9]);
      const tool = await TpmEvidenceTool.start({ ca, initdata: DOC, firmwareEvents: prediction.events });
      tools.push(tool);
      const nonce = randomBytes(32).toString('base64');
      const ch = verifier.challenge(tool.requestExtraParams(), nonce);
      const rd = teeRuntimeData(nonce).bytes;
      const res = verifier.verify({
        nonce,
        runtimeDataBytes: rd,
        initdataBody: DOC,
        evidence: await tool.evidence(ch.extraParams, rd),
        sessionState: ch.sessionState,
        nowMs: Date.now(),
      });
      expect(res.ok, JSON.stringify(res)).toBe(true);
      if (!res.ok) return;
      for (const [pcr, value] of Object.entries(prediction.pcrs))
        expect(res.claims.measurements[`tpm_pcr${pcr}`], `PCR ${pcr}`).toBe(value);
    },
  );

  it('a pod without initdata verifies with no init-data and claims none', async () => {
    const tool = await TpmEvidenceTool.start({ ca });
    tools.push(tool);
    const nonce = randomBytes(32).toString('base64');
    const ch = verifier.challenge(tool.requestExtraParams(), nonce);
    const rd = teeRuntimeData(nonce).bytes;
    const input = {
      nonce,
      runtimeDataBytes: rd,
      initdataBody: null,
      evidence: await tool.evidence(ch.extraParams, rd),
      sessionState: ch.sessionState,
      nowMs: Date.now(),
    };
    const res = verifier.verify(input);
    expect(res.ok, JSON.stringify(res)).toBe(true);
    if (res.ok) expect(res.claims.measurements.init_data).toBeUndefined();
    // Claiming an init-data it never measured is refused.
    expect(fields(verifier.verify({ ...input, initdataBody: DOC }))).toEqual(['init_data']);
  });
});
