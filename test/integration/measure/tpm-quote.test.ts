/**
 * The guest's raw TPM 2.0 commands (guest/agent/tpm.ts) against a real swtpm (0.7, a fresh state
 * in a temporary directory, its command channel on a unix socket, `--server type=unixio`):
 *  - PCR 8 extended with sha256 of an initdata document reads back as src/measure/initdata.ts's
 *    vtpmPcr8 predicts; a second document changes it;
 *  - a quote (attestation key made with TPM2_CreatePrimary, TPM2_Quote with a nonce) verifies
 *    with src/measure/quote.ts and independently with tpm2-tools' tpm2_checkquote (offline, over
 *    the same files); a wrong nonce, a changed byte of the quote, a changed PCR value or another
 *    key are refused;
 *  - the agent's start-up step (guest/agent/tpm-initdata.ts) on a document file standing in for
 *    the fw_cfg entry: PCR 8 extended once, the same bytes published read-only, nothing extended
 *    again by a restarted agent, an oversized document withheld;
 *  - the agent's GetTpmQuote rpc through the real channel (AgentService on a unix socket,
 *    AgentClient on the host side) verifies, and an agent without a TPM answers TPM_UNAVAILABLE;
 *  - KATA_TS_WRITE_QUOTE_VECTOR=1 writes the quote as test/fixtures/measure/tpm-quote-swtpm.json,
 *    the vector the unit test of the verifier reads.
 * swtpm is ended by its pid and the directory removed, pass or fail.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import { TpmClient, type TpmTransport } from '../../../guest/agent/tpm.js';
import { connectTpmSocket } from '../../../guest/agent/tpm-device.js';
import { measureInitdata } from '../../../guest/agent/tpm-initdata.js';
import { AgentClient } from '../../../src/agent-client/index.js';
import { serveDuplex } from '../../../src/channel/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { KATA_TS_INITDATA_ANNOTATION, parseInitdataAnnotation, vtpmPcr8 } from '../../../src/measure/initdata.js';
import { verifyQuote } from '../../../src/measure/quote.js';
import { rejection, thrown } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';
import { FakeContainerBackend } from '../../unit/agent-client/fake-backend.js';

const SWTPM = '/usr/bin/swtpm';
const CHECKQUOTE = '/usr/bin/tpm2_checkquote';
const missing = [SWTPM, CHECKQUOTE].filter((p) => !existsSync(p));
const FIXTURE = path.join(import.meta.dirname, '..', '..', 'fixtures', 'measure', 'tpm-quote-swtpm.json');

const DOC = 'version = "0.1.0"\nalgorithm = "sha384"\n\n[data]\n"policy.rego" = \'\'\'\npackage agent_policy\n\'\'\'\n';

describe.skipIf(missing.length > 0)('guest TPM commands against a real swtpm', () => {
  let work = '';
  let swtpm: ChildProcess | undefined;
  let tpm: TpmClient | undefined;
  let sock = '';
  let transport: TpmTransport | undefined;
  /**
   * swtpm serves one connection at a time: the agent's code gets the test's connection, with a
   * close that leaves it open.
   */
  const borrowTpm = async (): Promise<TpmTransport> => ({ send: (c) => (transport as TpmTransport).send(c), close: async () => {} });

  beforeAll(async () => {
    work = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-tpm-quote-'));
    sock = path.join(work, 'cmd.sock');
    const log = openSync(path.join(work, 'swtpm.log'), 'w');
    swtpm = spawn(
      SWTPM,
      [
        'socket',
        '--tpm2',
        '--tpmstate',
        `dir=${work}`,
        '--server',
        `type=unixio,path=${sock}`,
        '--ctrl',
        `type=unixio,path=${path.join(work, 'ctrl.sock')}`,
        '--flags',
        'not-need-init,startup-clear',
      ],
      { stdio: ['ignore', log, log] },
    );
    await until('swtpm command socket', async () => (existsSync(sock) ? true : undefined), 30_000, 50);
    transport = await connectTpmSocket(sock);
    tpm = new TpmClient(transport);
  });

  afterAll(async () => {
    await tpm?.close().catch(() => undefined);
    if (swtpm?.pid !== undefined && swtpm.exitCode === null) {
      const gone = new Promise((r) => swtpm?.once('exit', r));
      process.kill(swtpm.pid, 'SIGTERM');
      await gone;
    }
    if (work !== '') rmSync(work, { recursive: true, force: true });
  });

  it('PCR 8 extended with sha256(initdata) is what the host predicts', async () => {
    const t = tpm as TpmClient;
    const initdata = parseInitdataAnnotation(gzipSync(DOC).toString('base64'), KATA_TS_INITDATA_ANNOTATION);
    expect((await t.pcrRead([8]))[8]).toEqual(Buffer.alloc(32));
    await t.pcrExtend(8, initdata.digests.sha256);
    expect((await t.pcrRead([8]))[8]?.toString('hex')).toBe(vtpmPcr8(initdata).value.toString('hex'));
  });

  it('a quote verifies with the host verifier and with tpm2_checkquote; tampering is refused', async () => {
    const t = tpm as TpmClient;
    const nonce = randomBytes(32);
    const pcrs = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    const q = await t.quote(nonce, pcrs);
    // More than 8 PCRs: the reader asked twice and got them all.
    expect(Object.keys(q.pcrValues).map(Number)).toEqual(pcrs);
    const ok = verifyQuote(q, nonce);
    expect(ok.pcrs).toEqual(pcrs);
    expect(ok.pcrValues[8]).toBe(q.pcrValues[8]?.toString('hex'));
    expect(ok.pcrDigest).toEqual(
      createHash('sha256')
        .update(Buffer.concat(pcrs.map((p) => q.pcrValues[p] as Buffer)))
        .digest(),
    );

    // tpm2-tools, offline: the TPM2B_PUBLIC, the TPMS_ATTEST and the TPMT_SIGNATURE as they are.
    const pub = path.join(work, 'ak.pub');
    writeFileSync(pub, Buffer.concat([Buffer.from([q.akPublic.length >> 8, q.akPublic.length & 0xff]), q.akPublic]));
    writeFileSync(path.join(work, 'quote.msg'), q.attest);
    writeFileSync(path.join(work, 'quote.sig'), q.signature);
    const check = (n: Buffer): string =>
      execFileSync(
        CHECKQUOTE,
        ['-u', pub, '-m', path.join(work, 'quote.msg'), '-s', path.join(work, 'quote.sig'), '-g', 'sha256', '-q', n.toString('hex')],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
      );
    // Exit status 0 is its verdict; it prints the signature it checked.
    expect(check(nonce)).toMatch(/^sig: [0-9a-f]+/);
    expect(() => check(randomBytes(32))).toThrow();

    expect(thrown(() => verifyQuote(q, randomBytes(32))).message).toMatch(/not the verifier's nonce/);
    const attest = Buffer.from(q.attest);
    attest[attest.length - 1] = (attest[attest.length - 1] ?? 0) ^ 1;
    expect(thrown(() => verifyQuote({ ...q, attest }, nonce)).message).toMatch(/signature does not verify/);
    const pcrValues = { ...q.pcrValues, 8: Buffer.alloc(32, 1) };
    expect(thrown(() => verifyQuote({ ...q, pcrValues }, nonce)).message).toMatch(/do not hash to the quote's PCR digest/);
    // A quote by the owner hierarchy's key, shown with the endorsement key's public area.
    const other = await t.quote(nonce, pcrs, 0x40000001);
    expect(other.akPublic.equals(q.akPublic)).toBe(false);
    expect(thrown(() => verifyQuote({ ...other, akPublic: q.akPublic }, nonce)).reason).toBe('MEASURE_QUOTE_INVALID');

    if (process.env.KATA_TS_WRITE_QUOTE_VECTOR === '1') {
      const hex = (b: Buffer) => b.toString('hex');
      writeFileSync(
        FIXTURE,
        `${JSON.stringify(
          {
            producedBy: 'swtpm 0.7 (Debian 12) driven by guest/agent/tpm.ts; test/integration/measure/tpm-quote.test.ts',
            initdataDocument: DOC,
            nonce: hex(nonce),
            attest: hex(q.attest),
            signature: hex(q.signature),
            akPublic: hex(q.akPublic),
            pcrValues: Object.fromEntries(Object.entries(q.pcrValues).map(([k, v]) => [k, hex(v)])),
          },
          null,
          2,
        )}\n`,
      );
    }
  });

  it("the agent's start measures the initdata document once, then publishes the same bytes read-only", async () => {
    const t = tpm as TpmClient;
    const before = (await t.pcrRead([8]))[8] as Buffer;
    const fwCfg = path.join(work, 'fw_cfg-initdata');
    const out = path.join(work, 'run', 'initdata.toml');
    const doc = Buffer.from(DOC.replace('agent_policy', 'other_policy'));
    writeFileSync(fwCfg, doc);
    const o = {
      logger: silentLogger(),
      openTpm: borrowTpm,
      hasTpm: async () => true,
      fwCfgPath: fwCfg,
      outPath: out,
    };
    expect(await measureInitdata(o)).toBe('measured');
    const expected = createHash('sha256')
      .update(Buffer.concat([before, createHash('sha256').update(doc).digest()]))
      .digest();
    expect((await t.pcrRead([8]))[8]).toEqual(expected);
    expect(readFileSync(out)).toEqual(doc);
    expect(statSync(out).mode & 0o777).toBe(0o444);
    // A restarted agent: published already, PCR 8 left alone.
    expect(await measureInitdata(o)).toBe('already-published');
    expect((await t.pcrRead([8]))[8]).toEqual(expected);
    // No document: nothing happens. No TPM and no hardware TEE: withheld, coded.
    expect(await measureInitdata({ ...o, fwCfgPath: path.join(work, 'absent') })).toBe('none');
    const err = await rejection(
      measureInitdata({ ...o, outPath: path.join(work, 'run', 'other.toml'), hasTpm: async () => false, teeDevices: [] }),
    );
    expect(err.reason).toBe('INITDATA_UNMEASURED');
    expect(existsSync(path.join(work, 'run', 'other.toml'))).toBe(false);
    // Larger than the host ever sends: withheld without being read, PCR 8 untouched.
    const big = path.join(work, 'fw_cfg-big');
    writeFileSync(big, Buffer.alloc(1024 * 1024 + 1, 0x20));
    expect(await measureInitdata({ ...o, fwCfgPath: big, outPath: path.join(work, 'run', 'big.toml') })).toBe('withheld');
    expect(existsSync(path.join(work, 'run', 'big.toml'))).toBe(false);
    expect((await t.pcrRead([8]))[8]).toEqual(expected);
  });

  it('GetTpmQuote through the agent channel verifies; an agent without a TPM says so', async () => {
    const sockets = new Set<net.Socket>();
    const servers: net.Server[] = [];
    const clients: AgentClient[] = [];
    const agent = async (name: string, withTpm: boolean): Promise<AgentClient> => {
      const service = new AgentService({
        backend: new FakeContainerBackend(),
        agentVersion: 'test',
        logger: silentLogger(),
        ...(withTpm ? { openTpm: borrowTpm } : {}),
      });
      const server = net.createServer((s) => {
        sockets.add(s);
        serveDuplex(s, (session) => service.attach(session));
      });
      servers.push(server);
      const socketPath = path.join(work, name);
      await new Promise<void>((r) => server.listen(socketPath, r));
      const client = await AgentClient.connect({ socketPath, logger: silentLogger(), hostVersion: 'test' }, 30_000);
      clients.push(client);
      return client;
    };
    try {
      const nonce = randomBytes(20);
      const q = await (await agent('agent.sock', true)).tpmQuote(nonce, [7, 8, 9], { timeoutMs: 60_000 });
      const v = verifyQuote(q, nonce);
      expect(v.pcrs).toEqual([7, 8, 9]);
      expect(v.pcrValues[8]).toBe(((await (tpm as TpmClient).pcrRead([8]))[8] as Buffer).toString('hex'));
      const err = await rejection((await agent('agent-no-tpm.sock', false)).tpmQuote(nonce, [8], { timeoutMs: 60_000 }));
      expect(err.reason).toBe('TPM_UNAVAILABLE');
    } finally {
      for (const c of clients) c.close();
      for (const s of sockets) s.destroy();
      await Promise.all(servers.map((srv) => new Promise((r) => srv.close(r))));
    }
  });
});
