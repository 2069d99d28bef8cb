/**
 * The guest's attester (guest/agent/attest) run on the host, no VM, against real parts:
 *  - a real swtpm (0.7) whose EK certificate was made by swtpm_setup with a test EK CA (as a vtpm
 *    pod's), reached through the guest's own TpmClient over swtpm's unix command socket;
 *  - the agent's real initdata step (guest/agent/tpm-initdata.ts): PCR 8 extended with the
 *    document, published where the attester reads it;
 *  - a real `kata-ts broker` (init, reference add, policy set, resource set, serve) on 127.0.0.1,
 *    its self-signed certificate the one the initdata carries, the EK CA bundle its tpm trust.
 * There is no firmware here, so there is no event log: the attester sends an empty one (as a guest
 * without securityfs would) and PCRs 0-7 are swtpm's zeros. The reference set names PCR 8, PCR 9
 * and the initdata digest.
 *
 * Checked: the attester attests at start and fetches a resource the policy allows, decrypted with
 * its in-memory key, equal to what the broker stored; a resource the policy gives to another
 * reference set is refused with ATTEST_RESOURCE_REFUSED naming it and carrying the broker's
 * detail; an initdata other than the one measured is refused (ATTEST_REFUSED with the broker's
 * reason); when the broker goes away and comes back (its sessions lost), the next resource
 * request waits for it and attests again. swtpm and the broker are ended by pid, the directory
 * removed, pass or fail.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Attester, createAttester } from '../../../guest/agent/attest/index.js';
import { connectTpmSocket } from '../../../guest/agent/tpm-device.js';
import { measureInitdata } from '../../../guest/agent/tpm-initdata.js';
import { createLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { extendPcr, ZERO_PCR_SHA256 } from '../../../src/measure/pcr.js';
import { initTpmCa, type TpmCa } from '../../../src/tpm/ca.js';
import { buildSwtpmSetupArgv } from '../../../src/tpm/swtpm.js';
import { rejection } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';

const SWTPM = '/usr/bin/swtpm';
const missing = [SWTPM, '/usr/bin/swtpm_setup', '/usr/bin/openssl'].filter((p) => !existsSync(p));
const ROOT = packageRoot();
const SECRET = Buffer.from(`lab secret ${'x'.repeat(100)}\n`);
const OTHER_SECRET = Buffer.from('for prod pods only');

function run(file: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 120_000, encoding: 'utf8', cwd: ROOT }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

/** `kata-ts broker ...` from source; it must succeed. */
async function broker(args: string[]): Promise<string> {
  const r = await run(process.execPath, ['--import', 'tsx', path.join(ROOT, 'src/cli/entry.ts'), 'broker', ...args]);
  if (r.code !== 0) throw new Error(`kata-ts broker ${args.join(' ')} failed (${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

/** A loopback port nothing listens on right now. */
async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** An initdata document naming the broker the CoCo way (aa.toml), plus `extra` in [data]. */
function initdataDoc(url: string, certPem: string, extra = ''): Buffer {
  const aa = `[token_configs.kbs]\nurl = "${url}"\ncert = """\n${certPem.trim()}\n"""\n`;
  return Buffer.from(`version = "0.1.0"\nalgorithm = "sha384"\n[data]\n"aa.toml" = '''\n${aa}'''\n${extra}`);
}

/** A kata-ts/reference-values/v1 set naming PCR 8 (one extend of sha256(doc)), PCR 9 (zero) and the initdata digest. */
function referenceSet(doc: Buffer): unknown {
  const sha = createHash('sha256').update(doc).digest();
  return {
    schema: 'kata-ts/reference-values/v1',
    pod: { name: 'attester', namespace: 'test', uid: 'u1' },
    handler: 'kata-ts-cvm',
    tee: 'vtpm',
    inputs: {
      kernelSha256: '0'.repeat(64),
      initrdSha256: '0'.repeat(64),
      cmdline: '',
      ramBelow4GiBBytes: 1,
      initdataSha256: sha.toString('hex'),
    },
    vtpm: {
      bank: 'sha256',
      pcrs: { '8': extendPcr(ZERO_PCR_SHA256, sha).toString('hex'), '9': ZERO_PCR_SHA256.toString('hex') },
      events: [],
      notPredicted: [],
    },
  };
}

describe.skipIf(missing.length > 0)('the guest attester against a real broker and swtpm', () => {
  let work = '';
  let ca: TpmCa | undefined;
  let swtpm: ChildProcess | undefined;
  let serve: ChildProcess | undefined;
  let serveOut = '';
  let tpmSocket = '';
  let brokerDir = '';
  let port = 0;
  let certPem = '';
  let initdataPath = '';
  let document: Buffer = Buffer.alloc(0);
  const log = createLogger({ level: 'error' });
  const attesters: Attester[] = [];

  const openTpm = () => connectTpmSocket(tpmSocket);

  const startServe = async () => {
    serveOut = '';
    const args = ['--import', 'tsx', path.join(ROOT, 'src/cli/entry.ts'), 'broker', 'serve', '--dir', brokerDir];
    args.push('--listen', `127.0.0.1:${port}`, '--tpm-ca-bundle', path.join(work, 'ca-bundle.pem'));
    const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    serve = child;
    child.stdout?.on('data', (c: Buffer) => {
      serveOut += c.toString();
    });
    child.stderr?.on('data', (c: Buffer) => {
      serveOut += c.toString();
    });
    await until(
      'the broker listening',
      async () => {
        if (child.exitCode !== null) throw new Error(`kata-ts broker serve exited ${child.exitCode}: ${serveOut}`);
        return serveOut.includes('listening on https://') ? true : undefined;
      },
      120_000,
      100,
    );
    expect(serveOut, 'the broker registered the tpm verifier').toMatch(/tees: [^)]*tpm/);
  };

  const stopServe = async () => {
    const child = serve;
    serve = undefined;
    if (child?.pid === undefined || child.exitCode !== null) return;
    const gone = new Promise((r) => child.once('exit', r));
    process.kill(child.pid, 'SIGTERM');
    await gone;
  };

  beforeAll(async () => {
    work = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-attester-'));
    // The node's EK CA and a TPM state with EK certificates signed by it, as a vtpm pod gets.
    ca = (await initTpmCa(path.join(work, 'ca'))).ca;
    writeFileSync(path.join(work, 'ca-bundle.pem'), ca.bundlePem);
    const state = path.join(work, 'tpm');
    mkdirSync(state, { mode: 0o700 });
    const setup = await run(
      '/usr/bin/swtpm_setup',
      buildSwtpmSetupArgv({ stagingDir: state, setupConfigFile: ca.current.setupConfigFile, swtpmBinary: SWTPM }),
    );
    if (setup.code !== 0) throw new Error(`swtpm_setup failed: ${setup.stderr}`);
    tpmSocket = path.join(work, 'swtpm.sock');
    const swtpmLog = openSync(path.join(work, 'swtpm.log'), 'w');
    swtpm = spawn(
      SWTPM,
      [
        'socket',
        '--tpm2',
        '--tpmstate',
        `dir=${state}`,
        '--server',
        `type=unixio,path=${tpmSocket}`,
        '--ctrl',
        `type=unixio,path=${tpmSocket}.ctrl`,
        '--flags',
        'not-need-init,startup-clear',
      ],
      { stdio: ['ignore', swtpmLog, swtpmLog] },
    );
    await until(
      'swtpm listening',
      async (note) => {
        if (swtpm?.exitCode !== null) throw new Error(`swtpm exited: ${readFileSync(path.join(work, 'swtpm.log'), 'utf8')}`);
        try {
          await (await openTpm()).close();
          return true;
        } catch (err) {
          note((err as Error).message);
          return undefined;
        }
      },
      30_000,
      100,
    );

    // The broker: its state, its certificate for the initdata.
    brokerDir = path.join(work, 'broker');
    port = await freePort();
    const init = JSON.parse(await broker(['init', '--dir', brokerDir, '--san', 'IP:127.0.0.1', '--json'])) as { cert: string };
    certPem = readFileSync(init.cert, 'utf8');
    document = initdataDoc(`https://127.0.0.1:${port}`, certPem);

    // The agent's initdata step, for real: PCR 8 extended with the document, then published.
    const fwCfg = path.join(work, 'fw_cfg_initdata');
    writeFileSync(fwCfg, document);
    initdataPath = path.join(work, 'run', 'initdata.toml');
    const outcome = await measureInitdata({ logger: log, openTpm, hasTpm: async () => true, fwCfgPath: fwCfg, outPath: initdataPath });
    expect(outcome).toBe('measured');

    writeFileSync(path.join(work, 'lab.json'), JSON.stringify(referenceSet(document)));
    // Another pod's measurements: its own initdata.
    writeFileSync(path.join(work, 'prod.json'), JSON.stringify(referenceSet(initdataDoc('https://prod.example', certPem))));
    await broker(['reference', 'add', 'lab', '--file', path.join(work, 'lab.json'), '--dir', brokerDir]);
    await broker(['reference', 'add', 'prod', '--file', path.join(work, 'prod.json'), '--dir', brokerDir]);
    writeFileSync(path.join(work, 'secret'), SECRET);
    writeFileSync(path.join(work, 'other'), OTHER_SECRET);
    await broker(['resource', 'set', 'default/key/lab', '--file', path.join(work, 'secret'), '--dir', brokerDir]);
    await broker(['resource', 'set', 'default/key/prod', '--file', path.join(work, 'other'), '--dir', brokerDir]);
    const policy = {
      schema: 'kata-ts/broker-policy/v1',
      resources: [
        { path: 'default/key/lab', allow: ['lab'] },
        { path: 'default/key/prod', allow: ['prod'] },
      ],
    };
    writeFileSync(path.join(work, 'policy.json'), JSON.stringify(policy));
    await broker(['policy', 'set', '--file', path.join(work, 'policy.json'), '--dir', brokerDir]);
    await startServe();
  }, 300_000);

  afterAll(async () => {
    await stopServe();
    if (swtpm?.pid !== undefined && swtpm.exitCode === null) {
      const gone = new Promise((r) => swtpm?.once('exit', r));
      process.kill(swtpm.pid, 'SIGTERM');
      await gone;
    }
    if (work !== '') rmSync(work, { recursive: true, force: true });
  });

  /** The broker's decision log, parsed. */
  const decisions = (): Array<Record<string, unknown>> =>
    readFileSync(path.join(brokerDir, 'decisions.log'), 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  const attester = (o: { initdataPath?: string } = {}) => {
    const a = createAttester({
      openTpm,
      initdataPath: o.initdataPath ?? initdataPath,
      eventLogPath: path.join(work, 'no-event-log'),
      log,
      retry: { firstDelayMs: 200, maxDelayMs: 2000, budgetMs: 120_000 },
    });
    attesters.push(a);
    return a;
  };

  it('attests at start with the TPM evidence, then fetches and decrypts the resource its reference set may read', async () => {
    const a = attester();
    expect(a.status()).toMatchObject({ state: 'idle', broker: `https://127.0.0.1:${port}` });
    a.start();
    await until(
      'the attester attested',
      async () => {
        const s = a.status();
        if (s.state === 'failed') throw new Error(`attestation failed: ${JSON.stringify(s.lastError)}\n${serveOut}`);
        return s.state === 'attested' ? s : undefined;
      },
      120_000,
      100,
    );
    expect(a.status().matched).toEqual(['lab']);
    const got = await a.resource('kbs:///default/key/lab');
    expect(got.equals(SECRET)).toBe(true);
    // The broker's decision log has the grant, and never the secret.
    const decisions = readFileSync(path.join(brokerDir, 'decisions.log'), 'utf8');
    expect(decisions).not.toContain(SECRET.toString().trim());
  });

  it('a resource the policy gives to another reference set: ATTEST_RESOURCE_REFUSED naming it, with the broker detail', async () => {
    const a = attester();
    const e = await rejection(a.resource('default/key/prod'));
    expect(e.reason).toBe('ATTEST_RESOURCE_REFUSED');
    expect(e.message).toContain('default/key/prod');
    expect(e.details).toMatchObject({ resource: 'default/key/prod', status: 403 });
    expect(String(e.details?.detail)).toContain('prod');
    expect(a.status().state).toBe('attested');
  });

  it('an initdata other than the one measured into PCR 8: the broker refuses the evidence (ATTEST_REFUSED with its reason)', async () => {
    const other = initdataDoc(`https://127.0.0.1:${port}`, certPem, '"policy.rego" = "package changed"\n');
    const otherPath = path.join(work, 'run', 'other-initdata.toml');
    writeFileSync(otherPath, other);
    const a = attester({ initdataPath: otherPath });
    const e = await rejection(a.resource('default/key/lab'));
    expect(e.reason).toBe('ATTEST_REFUSED');
    expect(e.message).toMatch(/pcr|init_data|PCR/);
    expect(a.status()).toMatchObject({ state: 'failed', lastError: { reason: 'ATTEST_REFUSED' } });
  });

  it('the broker restarts (sessions lost): a request meanwhile waits for it, attests again and reads the resource', async () => {
    const a = attester();
    await a.resource('default/key/lab');
    const before = decisions();
    await stopServe();
    const pending = a.resource('default/key/lab');
    // Let the attester find the broker gone at least once before it comes back.
    await new Promise((r) => setTimeout(r, 500));
    await startServe();
    const got = await pending;
    expect(got.equals(SECRET)).toBe(true);
    expect(a.status().state).toBe('attested');
    // What the new broker saw: the old session's cookie refused (401), one new attestation, the release.
    const after = decisions().slice(before.length);
    expect(after.filter((d) => d.event === 'resource' && d.outcome === 'refused' && d.status === 401)).toHaveLength(1);
    expect(after.filter((d) => d.event === 'attest' && d.outcome === 'granted')).toHaveLength(1);
    expect(after.filter((d) => d.event === 'resource' && d.outcome === 'released')).toHaveLength(1);
  });
});
