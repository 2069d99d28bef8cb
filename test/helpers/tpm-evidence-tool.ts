/**
 * Stand-in `tpm` evidence from a real software TPM, for the tests and benches that need a vtpm
 * pod's attestation without booting one (the broker's tests, the attack tests, the throughput
 * bench). What is real and what stands in:
 * - real: swtpm (its state and EK certificates made by swtpm_setup with the private config of a
 *   CA made by src/tpm/ca.ts's initTpmCa in a temporary dir, exactly as a pod's swtpm gets them),
 *   every TPM command (guest/agent/tpm.ts's TpmClient, the guest's own code: EK certificate from
 *   NV, attestation key, credential activation, quote), the agent's initdata step
 *   (guest/agent/tpm-initdata.ts measureInitdata extends PCR 8 and publishes the document);
 * - stand-in, named so: the **firmware**. No OVMF runs, so the tool extends PCRs 0-7 and 9 itself
 *   with the digests of a list of events (by default a short OVMF-like boot; a test may pass the
 *   events src/measure/vtpm.ts predicts, so the claims match a reference-values document) and
 *   keeps the crypto-agile event log it would have written (src/attest/eventlog.ts encodeEventLog).
 *
 * swtpm serves its command socket (`--server type=unixio`) to one connection, which the tool
 * holds; TpmClient runs one command at a time, so concurrent `evidence` calls queue.
 *
 * Cleanup: `close()` ends the tool's own swtpm by its PID (SIGTERM, then SIGKILL if it has not
 * exited in time; swtpm runs with --terminate, so it also leaves when the process holding its
 * connection dies) and removes the tool's directory (the swtpm state, socket, log, and the CA when
 * the tool made it). A CA made with `makeToolCa` and shared by several tools is removed by its
 * own `cleanup()`. Call them in `afterAll`/`finally`: they are safe to call twice.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash, generateKeyPairSync, type KeyObject, X509Certificate } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TpmClient, type TpmQuote, type TpmTransport } from '../../guest/agent/tpm.js';
import { connectTpmSocket } from '../../guest/agent/tpm-device.js';
import { measureInitdata } from '../../guest/agent/tpm-initdata.js';
import { type EncodeEvent, encodeEventLog, TCG_EVENT_TYPES } from '../../src/attest/eventlog.js';
import { type KbsRuntimeData, runtimeDataBytes } from '../../src/attest/kbs-protocol.js';
import {
  type AgentExtend,
  credentialProof,
  encodeTpmEvidence,
  encodeTpmRequestParams,
  parseTpmChallengeParams,
  TPM_EVIDENCE_PCRS,
  type TpmEvidenceJson,
  type TpmRequestParamsJson,
  tpmQuoteNonce,
} from '../../src/attest/tpm-evidence.js';
import { silentLogger } from '../../src/common/logger.js';
import type { PcrEvent } from '../../src/measure/pcr.js';
import { SEPARATOR_DIGEST_SHA256, sha256 } from '../../src/measure/pcr.js';
import { initTpmCa, readTpmCa } from '../../src/tpm/ca.js';
import { buildSwtpmSetupArgv, DEFAULT_SWTPM_BINARY, DEFAULT_SWTPM_SETUP_BINARY } from '../../src/tpm/swtpm.js';
import { until } from './poll.js';
import { scaledMs } from './time-scale.js';

/** Whether this host has what the tool runs (tests skip with the list of what is missing). */
export function tpmEvidenceToolMissing(): string[] {
  return [DEFAULT_SWTPM_BINARY, DEFAULT_SWTPM_SETUP_BINARY, '/usr/bin/swtpm_localca'].filter((p) => !existsSync(p));
}

/** A node TPM CA in a temporary dir (src/tpm/ca.ts layout): its bundle is what a verifier trusts. */
export interface ToolCa {
  root: string;
  bundlePem: string;
  /** Removes the CA's dir (safe to call twice). */
  cleanup(): Promise<void>;
}

/** Makes a CA with initTpmCa in a fresh temporary dir under `parent` (os.tmpdir() by default). */
export async function makeToolCa(parent: string = os.tmpdir()): Promise<ToolCa> {
  const dir = mkdtempSync(path.join(parent, 'kata-ts-tpm-tool-ca-'));
  const root = path.join(dir, 'ca');
  try {
    const { ca } = await initTpmCa(root);
    return { root, bundlePem: ca.bundlePem, cleanup: async () => rmSync(dir, { recursive: true, force: true }) };
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

const ev = (pcr: number, type: string, data: string | Buffer, description: string): PcrEvent => ({
  pcr,
  type,
  digestSha256: sha256(data).toString('hex'),
  description,
});

/**
 * The stand-in firmware's default boot: the shape of an OVMF direct kernel boot (CRTM version and
 * firmware volumes in PCR 0, a separator in each of PCRs 0-7, the kernel and the boot action in
 * PCR 4, the command line and initrd in PCR 9). Digests of fixed text, so every tool has the
 * same values for PCRs 0-7 and 9.
 */
export const DEFAULT_FIRMWARE_EVENTS: readonly PcrEvent[] = [
  ev(0, 'EV_S_CRTM_VERSION', Buffer.from('kata-ts stand-in firmware\0', 'utf16le'), 'CRTM version'),
  ev(0, 'EV_EFI_PLATFORM_FIRMWARE_BLOB', 'stand-in PEIFV', 'firmware volume PEIFV'),
  ev(0, 'EV_EFI_PLATFORM_FIRMWARE_BLOB', 'stand-in DXEFV', 'firmware volume DXEFV'),
  ...[0, 1, 2, 3, 5, 6, 7].map(
    (pcr): PcrEvent => ({ pcr, type: 'EV_SEPARATOR', digestSha256: SEPARATOR_DIGEST_SHA256.toString('hex'), description: 'separator' }),
  ),
  ev(4, 'EV_EFI_BOOT_SERVICES_APPLICATION', 'stand-in kernel image', 'the kernel'),
  ev(4, 'EV_EFI_ACTION', 'Calling EFI Application from Boot Option', 'Calling EFI Application from Boot Option'),
  { pcr: 4, type: 'EV_SEPARATOR', digestSha256: SEPARATOR_DIGEST_SHA256.toString('hex'), description: 'separator' },
  ev(9, 'EV_EVENT_TAG', Buffer.from('console=ttyS0 initrd=initrd\0', 'utf16le'), 'LoadOptions'),
  ev(9, 'EV_EVENT_TAG', 'stand-in initrd', 'Linux initrd'),
];

const TYPE_NUMBERS = new Map(Object.entries(TCG_EVENT_TYPES).map(([n, name]) => [name, Number(n)]));

function toLogEvent(e: PcrEvent): EncodeEvent {
  const type = TYPE_NUMBERS.get(e.type);
  if (type === undefined) throw new Error(`stand-in firmware event of PCR ${e.pcr} has unknown type ${e.type}`);
  return { pcr: e.pcr, type, digests: { sha256: Buffer.from(e.digestSha256, 'hex') }, data: Buffer.from(e.description, 'utf8') };
}

function run(file: string, args: string[], timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs }, (err, stdout, stderr) =>
      err ? reject(new Error(`${file} failed: ${(stderr || stdout || err.message).trim().split('\n').slice(-3).join(' ')}`)) : resolve(),
    );
  });
}

export interface TpmEvidenceToolOptions {
  /** The initdata document PCR 8 is extended with by the agent's own step; null or absent: none. */
  initdata?: Buffer | null;
  /** A CA shared with other tools (makeToolCa); by default the tool makes its own in its dir. */
  ca?: ToolCa;
  /** What the stand-in firmware measures (PCRs other than 8); DEFAULT_FIRMWARE_EVENTS by default. */
  firmwareEvents?: readonly PcrEvent[];
  /** Where the tool's temporary dir is made (os.tmpdir() by default). */
  parentDir?: string;
}

/** A runtime-data object with a fresh P-256 tee key, its bytes, and the private key (for decrypting a JWE). */
export function teeRuntimeData(nonce: string): { runtimeData: KbsRuntimeData; bytes: Buffer; privateKey: KeyObject } {
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = publicKey.export({ format: 'jwk' }) as { x: string; y: string };
  const runtimeData: KbsRuntimeData = { nonce, 'tee-pubkey': { kty: 'EC', crv: 'P-256', alg: 'ECDH-ES+A256KW', x: jwk.x, y: jwk.y } };
  return { runtimeData, bytes: runtimeDataBytes(runtimeData), privateKey };
}

/** A running swtpm with the state of a vtpm pod after boot (see the file's comment). */
export class TpmEvidenceTool {
  private closed = false;

  private constructor(
    /** The tool's own temporary dir (removed by close). */
    readonly dir: string,
    private readonly child: ChildProcess,
    private readonly transport: TpmTransport,
    private readonly client: TpmClient,
    /** The CA whose bundle a verifier must trust for this tool's EK certificate. */
    readonly ca: ToolCa,
    private readonly ownsCa: boolean,
    /** The EK certificate read from the TPM's NV (PEM). */
    readonly ekCertPem: string,
    /** TPMT_PUBLIC of the attestation key (the primary key the guest code makes). */
    readonly akPublic: Buffer,
    readonly akName: Buffer,
    /** The stand-in firmware's crypto-agile event log. */
    readonly eventLog: Buffer,
    /** The agent's own extends (PCR 8 with sha256 of the initdata, when there is one). */
    readonly agentExtends: AgentExtend[],
    readonly initdata: Buffer | null,
  ) {}

  /** The swtpm's PID (ended by close). */
  get pid(): number {
    return this.child.pid as number;
  }

  /** Makes the state, starts swtpm, runs the stand-in firmware and the agent's initdata step. */
  static async start(o: TpmEvidenceToolOptions = {}): Promise<TpmEvidenceTool> {
    const dir = mkdtempSync(path.join(o.parentDir ?? os.tmpdir(), 'kata-ts-tpm-tool-'));
    let child: ChildProcess | undefined;
    let transport: TpmTransport | undefined;
    let ownCa: ToolCa | undefined;
    try {
      // The tool's own CA lives in its dir, so a failure's rm of the dir takes it too.
      if (o.ca === undefined) ownCa = await makeToolCa(dir);
      const ca = o.ca ?? (ownCa as ToolCa);
      const tpmCa = await readTpmCa(ca.root);
      const state = path.join(dir, 'state');
      mkdirSync(state, { mode: 0o700 });
      await run(
        DEFAULT_SWTPM_SETUP_BINARY,
        buildSwtpmSetupArgv({ stagingDir: state, setupConfigFile: tpmCa.current.setupConfigFile, swtpmBinary: DEFAULT_SWTPM_BINARY }),
        scaledMs(60_000),
      );
      const sock = path.join(dir, 'cmd.sock');
      const log = openSync(path.join(dir, 'swtpm.log'), 'w');
      try {
        child = spawn(
          DEFAULT_SWTPM_BINARY,
          [
            'socket',
            '--tpm2',
            '--tpmstate',
            `dir=${state}`,
            '--server',
            `type=unixio,path=${sock}`,
            '--ctrl',
            `type=unixio,path=${path.join(dir, 'ctrl.sock')}`,
            '--flags',
            'not-need-init,startup-clear',
            // Gone with its one connection: a test process that dies without close() leaves no swtpm.
            '--terminate',
          ],
          { stdio: ['ignore', log, log] },
        );
      } finally {
        closeSync(log);
      }
      const started = child;
      await until(
        'the stand-in swtpm to listen',
        async () => {
          if (started.exitCode !== null) throw new Error(`swtpm exited with ${started.exitCode} before it listened`);
          return existsSync(sock) ? true : undefined;
        },
        scaledMs(30_000),
        50,
      );
      transport = await connectTpmSocket(sock);
      const client = new TpmClient(transport);

      // The stand-in firmware: extend, and keep the log it would have written.
      const firmware = (o.firmwareEvents ?? DEFAULT_FIRMWARE_EVENTS).filter((e) => e.pcr !== 8);
      for (const e of firmware) await client.pcrExtend(e.pcr, Buffer.from(e.digestSha256, 'hex'));
      const eventLog = encodeEventLog(['sha256'], firmware.map(toLogEvent));

      // The agent's own step, on a file standing in for the fw_cfg entry.
      const initdata = o.initdata ?? null;
      const agentExtends: AgentExtend[] = [];
      if (initdata !== null) {
        const fwCfg = path.join(dir, 'fw_cfg-initdata');
        writeFileSync(fwCfg, initdata);
        const outcome = await measureInitdata({
          logger: silentLogger(),
          openTpm: async () => ({ send: (c) => (transport as TpmTransport).send(c), close: async () => {} }),
          hasTpm: async () => true,
          fwCfgPath: fwCfg,
          outPath: path.join(dir, 'run', 'initdata.toml'),
        });
        if (outcome !== 'measured') throw new Error(`the agent's initdata step answered ${outcome}, not measured`);
        agentExtends.push({ pcr: 8, digestSha256: createHash('sha256').update(initdata).digest(), what: 'initdata' });
      }

      const ekCertPem = new X509Certificate(await client.ekCertificate()).toString();
      const ak = await client.akPublic();
      return new TpmEvidenceTool(
        dir,
        child,
        transport,
        client,
        ca,
        ownCa !== undefined,
        ekCertPem,
        ak.public,
        ak.name,
        eventLog,
        agentExtends,
        initdata,
      );
    } catch (err) {
      await transport?.close().catch(() => undefined);
      if (child !== undefined) await stopChild(child);
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** The Request's tpm extra-params, as the guest sends them. */
  requestExtraParams(): TpmRequestParamsJson {
    return encodeTpmRequestParams({ ekCertPem: this.ekCertPem, akPublic: this.akPublic });
  }

  /** TPM2_ActivateCredential of a Challenge's tpm extra-params: the secret (rejects TPM_CREDENTIAL_REFUSED when not this TPM's). */
  activate(challengeExtraParams: unknown): Promise<Buffer> {
    const { credentialBlob, encryptedSecret } = parseTpmChallengeParams(challengeExtraParams);
    return this.client.activateCredential(credentialBlob, encryptedSecret);
  }

  /** A quote of `pcrs` with `nonce` as qualifying data, by the attestation key. */
  quote(nonce: Buffer, pcrs: readonly number[] = TPM_EVIDENCE_PCRS): Promise<TpmQuote> {
    return this.client.quote(nonce, pcrs);
  }

  /** PCR values (sha256 bank) as lower-case hex, keyed by PCR. */
  async pcrs(pcrs: readonly number[] = TPM_EVIDENCE_PCRS): Promise<Record<number, string>> {
    const v = await this.client.pcrRead(pcrs);
    return Object.fromEntries(Object.entries(v).map(([k, b]) => [Number(k), b.toString('hex')]));
  }

  /**
   * Sends one raw TPM command and returns the whole response (for attacks the guest code never
   * makes, such as loading another TPM's key from its public part). Not to be mixed with calls
   * still in flight: it bypasses the client's queue.
   */
  sendRaw(command: Buffer): Promise<Buffer> {
    return this.transport.send(command);
  }

  /** Extends a PCR (to make this TPM's state differ from what the log says). */
  extend(pcr: number, digestSha256: Buffer): Promise<void> {
    return this.client.pcrExtend(pcr, digestSha256);
  }

  /**
   * The evidence the guest would send for this Challenge and these runtime data bytes: the
   * credential activated, PCRs 0-9 quoted with sha256(runtimeDataBytes), the stand-in firmware's
   * log, the agent's extends, the EK certificate and the credential proof.
   */
  async evidence(challengeExtraParams: unknown, runtimeDataBytes: Buffer): Promise<TpmEvidenceJson> {
    const secret = await this.activate(challengeExtraParams);
    const q = await this.quote(tpmQuoteNonce(runtimeDataBytes));
    return encodeTpmEvidence({
      akPublic: this.akPublic,
      quote: { message: q.attest, signature: q.signature, pcrs: TPM_EVIDENCE_PCRS.map((p) => q.pcrValues[p] as Buffer) },
      eventLog: this.eventLog,
      agentExtends: this.agentExtends,
      ekCertPem: this.ekCertPem,
      credentialProof: credentialProof(secret, runtimeDataBytes),
    });
  }

  /** Ends the swtpm (by PID) and removes the tool's dir; the CA too when the tool made it. Safe twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.client.close().catch(() => undefined);
      await stopChild(this.child);
    } finally {
      rmSync(this.dir, { recursive: true, force: true });
      if (this.ownsCa) await this.ca.cleanup();
    }
  }
}

/** SIGTERM to the child's PID, SIGKILL if it has not exited within a generous bound. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise<void>((r) => child.once('exit', () => r()));
  process.kill(child.pid, 'SIGTERM');
  const timer = setTimeout(() => {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) process.kill(child.pid, 'SIGKILL');
  }, scaledMs(10_000));
  await gone;
  clearTimeout(timer);
}
