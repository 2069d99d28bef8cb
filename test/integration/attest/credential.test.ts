/**
 * Credential activation against a real swtpm (0.7), no VM: the node's EK CA made by initTpmCa in a
 * temporary root, two TPM states made by swtpm_setup with it (EK certificates in NV, as a pod's),
 * the first one served by swtpm on a loopback TCP port (the transport tpm2-tools' swtpm TCTI also
 * speaks), the second one used only for its EK certificate ("another TPM").
 *  - the guest client reads the EK certificate from NV (what swtpm_setup wrote, signed by the CA)
 *    and makes the EK from the TCG default template: the certified key;
 *  - src/attest/credential.ts's makeCredential -> the guest's activateCredential returns the secret;
 *  - independent implementation, both ways: our credential activated by tpm2_activatecredential
 *    (EK from tpm2_createek, AK from tpm2_createak), and tpm2_makecredential's (from the EK
 *    certificate's key, offline) activated by the guest client; our object names equal tpm2-tools';
 *    an ECC P-256 EK (tpm2_createek -G ecc, the TCG L-2 template): our credential (ECDH + KDFe)
 *    activated by tpm2_activatecredential, one for another name refused;
 *  - attacks: a credential made for another key's name, to another TPM's EK, with a byte of the
 *    blob or of the seed changed, or with the seed of another credential, is refused by the TPM
 *    and reported as TPM_CREDENTIAL_REFUSED; a malformed blob is refused before any command; and
 *    nothing (object or session) is left loaded in the TPM afterwards.
 * swtpm is ended by its pid and the directory removed, pass or fail.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createPublicKey, randomBytes, X509Certificate } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TPM_RH_OWNER, TpmClient } from '../../../guest/agent/tpm.js';
import { connectTpmSocket } from '../../../guest/agent/tpm-device.js';
import { ekPublicKeyFromCertificate, type MadeCredential, makeCredential, objectName } from '../../../src/attest/credential.js';
import { initTpmCa, type TpmCa } from '../../../src/tpm/ca.js';
import { buildSwtpmSetupArgv, checkEkCertificate } from '../../../src/tpm/swtpm.js';
import { rejection } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';

const SWTPM = '/usr/bin/swtpm';
const TOOLS = ['tpm2_createek', 'tpm2_createak', 'tpm2_makecredential', 'tpm2_activatecredential', 'tpm2_flushcontext', 'tpm2_getcap'];
const NEEDED = [SWTPM, '/usr/bin/swtpm_setup', '/usr/bin/openssl', ...TOOLS.map((t) => `/usr/bin/${t}`)];
const missing = NEEDED.filter((p) => !existsSync(p));
/** tpm2-tools' credential file: magic, version, then the two TPM2Bs. */
const TOOLS_CREDENTIAL_MAGIC = 0xbadcc0de;

function run(file: string, args: string[], env?: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 120_000, encoding: 'utf8', env: { ...process.env, ...env } }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

/** Two consecutive free loopback ports (swtpm's command port and, next to it, the control port the TCTI expects). */
async function freePortPair(): Promise<number> {
  const tryListen = (port: number) =>
    new Promise<net.Server | undefined>((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(undefined));
      s.listen(port, '127.0.0.1', () => resolve(s));
    });
  for (let i = 0; i < 50; i++) {
    const port = 20_000 + 2 * Math.floor(Math.random() * 10_000);
    const a = await tryListen(port);
    const b = a === undefined ? undefined : await tryListen(port + 1);
    for (const s of [a, b]) if (s !== undefined) await new Promise((r) => s.close(r));
    if (a !== undefined && b !== undefined) return port;
  }
  throw new Error('no free pair of loopback ports found');
}

/** A credential as tpm2-tools writes and reads it. */
function toolsCredentialFile(c: MadeCredential): Buffer {
  const header = Buffer.alloc(8);
  header.writeUInt32BE(TOOLS_CREDENTIAL_MAGIC, 0);
  header.writeUInt32BE(1, 4);
  return Buffer.concat([header, c.credentialBlob, c.encryptedSecret]);
}

function parseToolsCredentialFile(b: Buffer): MadeCredential {
  expect(b.readUInt32BE(0)).toBe(TOOLS_CREDENTIAL_MAGIC);
  const blobEnd = 8 + 2 + b.readUInt16BE(8);
  const credentialBlob = b.subarray(8, blobEnd);
  const encryptedSecret = b.subarray(blobEnd, blobEnd + 2 + b.readUInt16BE(blobEnd));
  expect(blobEnd + encryptedSecret.length).toBe(b.length);
  return { credentialBlob, encryptedSecret };
}

describe.skipIf(missing.length > 0)('credential activation against a real swtpm', () => {
  let work = '';
  let ca: TpmCa | undefined;
  let swtpm: ChildProcess | undefined;
  let port = 0;
  let tpm: TpmClient | undefined;
  let ekCertFile: Buffer = Buffer.alloc(0);
  let otherEkCertFile: Buffer = Buffer.alloc(0);

  const client = (): TpmClient => tpm as TpmClient;
  const connect = async () => {
    tpm = new TpmClient(await connectTpmSocket({ host: '127.0.0.1', port }));
  };
  const toolEnv = () => ({ TPM2TOOLS_TCTI: `swtpm:host=127.0.0.1,port=${port}` });
  /** A tpm2-tools command against the running swtpm; it must succeed. */
  const tool = async (name: string, args: string[]): Promise<string> => {
    const r = await run(`/usr/bin/${name}`, args, toolEnv());
    if (r.code !== 0) throw new Error(`${name} ${args.join(' ')} failed (${r.code}): ${r.stderr.trim()}`);
    return r.stdout;
  };
  /**
   * swtpm serves one connection at a time: the guest client lets go while tpm2-tools talk to it.
   * Without a resource manager the tools leave transient objects loaded: flushed after each use.
   */
  const withTools = async <T>(fn: () => Promise<T>): Promise<T> => {
    await tpm?.close();
    tpm = undefined;
    try {
      return await fn();
    } finally {
      await run('/usr/bin/tpm2_flushcontext', ['-t'], toolEnv());
      await connect();
    }
  };

  /** swtpm_setup makes a TPM state in `dir` with EK certificates signed by the test's CA. */
  const setupTpm = async (dir: string): Promise<Buffer> => {
    mkdirSync(dir, { mode: 0o700 });
    const argv = buildSwtpmSetupArgv({ stagingDir: dir, setupConfigFile: (ca as TpmCa).current.setupConfigFile, swtpmBinary: SWTPM });
    const r = await run('/usr/bin/swtpm_setup', argv);
    if (r.code !== 0) throw new Error(`swtpm_setup failed: ${r.stderr} ${readFileSync(path.join(dir, 'setup.log'), 'utf8')}`);
    return readFileSync(path.join(dir, 'ek-rsa2048.crt'));
  };

  beforeAll(async () => {
    work = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-credential-'));
    ca = (await initTpmCa(path.join(work, 'ca'))).ca;
    ekCertFile = await setupTpm(path.join(work, 'tpm1'));
    otherEkCertFile = await setupTpm(path.join(work, 'tpm2'));
    port = await freePortPair();
    const log = openSync(path.join(work, 'swtpm.log'), 'w');
    swtpm = spawn(
      SWTPM,
      [
        'socket',
        '--tpm2',
        '--tpmstate',
        `dir=${path.join(work, 'tpm1')}`,
        '--server',
        `type=tcp,port=${port},bindaddr=127.0.0.1`,
        '--ctrl',
        `type=tcp,port=${port + 1},bindaddr=127.0.0.1`,
        '--flags',
        'not-need-init,startup-clear',
      ],
      { stdio: ['ignore', log, log] },
    );
    await until(
      'swtpm listening on its command port',
      async (note) => {
        if (swtpm?.exitCode !== null) throw new Error(`swtpm exited: ${readFileSync(path.join(work, 'swtpm.log'), 'utf8')}`);
        try {
          await connect();
          return true;
        } catch (err) {
          note((err as Error).message);
          return undefined;
        }
      },
      30_000,
      100,
    );
  }, 180_000);

  afterAll(async () => {
    await tpm?.close().catch(() => undefined);
    if (swtpm?.pid !== undefined && swtpm.exitCode === null) {
      const gone = new Promise((r) => swtpm?.once('exit', r));
      process.kill(swtpm.pid, 'SIGTERM');
      await gone;
    }
    if (work !== '') rmSync(work, { recursive: true, force: true });
  });

  it('reads the EK certificate swtpm_setup wrote from NV; it chains to the CA and certifies the default-template EK', async () => {
    const der = await client().ekCertificate();
    expect(der.equals(ekCertFile)).toBe(true);
    expect(() => checkEkCertificate(der, (ca as TpmCa).current.certPem)).not.toThrow();
    // The other TPM's certificate is signed by the same CA but is another key.
    expect(() => checkEkCertificate(otherEkCertFile, (ca as TpmCa).current.certPem)).not.toThrow();
    const ek = await client().ekPublic();
    expect(objectName(ek.public)).toEqual(ek.name);
    const n = Buffer.from(ekPublicKeyFromCertificate(der).export({ format: 'jwk' }).n as string, 'base64url');
    // TPMT_PUBLIC of an RSA key ends with its unique field: the 256-byte modulus.
    expect(ek.public.subarray(ek.public.length - 256)).toEqual(n);
    expect(ek.public.readUInt16BE(ek.public.length - 258)).toBe(256);
    const other = Buffer.from(new X509Certificate(otherEkCertFile).publicKey.export({ format: 'jwk' }).n as string, 'base64url');
    expect(other.equals(n)).toBe(false);
  });

  it('makeCredential for the EK certificate and the AK name -> activateCredential returns the secret', async () => {
    const ekKey = ekPublicKeyFromCertificate(await client().ekCertificate());
    const ak = await client().akPublic();
    for (const size of [32, 16, 1]) {
      const secret = randomBytes(size);
      const c = makeCredential(ekKey, ak.name, secret);
      expect(await client().activateCredential(c.credentialBlob, c.encryptedSecret)).toEqual(secret);
    }
    // The AK activated is the one that quotes: its quote names the same public area.
    const q = await client().quote(randomBytes(32), [8]);
    expect(q.akPublic).toEqual(ak.public);
  });

  it('cross-checks with tpm2-tools both ways: our credential opens with tpm2_activatecredential, theirs with the guest client', async () => {
    const ours = await client().ekPublic();
    const ourAk = await client().akPublic();
    const ekKey = ekPublicKeyFromCertificate(ekCertFile);
    const d = path.join(work, 'tools');
    mkdirSync(d);
    const f = (n: string) => path.join(d, n);
    const secret = randomBytes(32);
    await withTools(async () => {
      await tool('tpm2_createek', ['-c', f('ek.ctx'), '-G', 'rsa', '-u', f('ek.pub')]);
      await tool('tpm2_flushcontext', ['-t']);
      // tpm2-tools' EK is ours: same template, same public area.
      expect(readFileSync(f('ek.pub')).subarray(2)).toEqual(ours.public);
      await tool('tpm2_createak', [
        '-C',
        f('ek.ctx'),
        '-c',
        f('ak.ctx'),
        '-G',
        'ecc',
        '-g',
        'sha256',
        '-s',
        'ecdsa',
        '-u',
        f('ak.pub'),
        '-n',
        f('ak.name'),
      ]);
      await tool('tpm2_flushcontext', ['-t']);
      const akName = readFileSync(f('ak.name'));
      // Our name of their key is their name of it.
      expect(objectName(readFileSync(f('ak.pub')).subarray(2))).toEqual(akName);
      writeFileSync(f('ours.cred'), toolsCredentialFile(makeCredential(ekKey, akName, secret)));
      await tool('tpm2_startauthsession', ['--policy-session', '-S', f('session.ctx')]);
      try {
        await tool('tpm2_policysecret', ['-S', f('session.ctx'), '-c', 'e']);
        await tool('tpm2_activatecredential', [
          '-c',
          f('ak.ctx'),
          '-C',
          f('ek.ctx'),
          '-i',
          f('ours.cred'),
          '-o',
          f('ours.out'),
          '-P',
          `session:${f('session.ctx')}`,
        ]);
      } finally {
        await run('/usr/bin/tpm2_flushcontext', [f('session.ctx')], toolEnv());
      }
      expect(readFileSync(f('ours.out'))).toEqual(secret);
    });

    // tpm2_makecredential, offline, from the EK certificate's key and our AK's name.
    const pem = ekKey.export({ format: 'pem', type: 'spki' }) as string;
    writeFileSync(f('ek.pem'), pem);
    const theirSecret = randomBytes(32);
    writeFileSync(f('secret.bin'), theirSecret);
    const r = await run('/usr/bin/tpm2_makecredential', [
      '-T',
      'none',
      '-u',
      f('ek.pem'),
      '-G',
      'rsa',
      '-s',
      f('secret.bin'),
      '-n',
      ourAk.name.toString('hex'),
      '-o',
      f('theirs.cred'),
    ]);
    expect(r.code, r.stderr).toBe(0);
    const theirs = parseToolsCredentialFile(readFileSync(f('theirs.cred')));
    expect(await client().activateCredential(theirs.credentialBlob, theirs.encryptedSecret)).toEqual(theirSecret);
  });

  it('an ECC EK (TCG template L-2, made by tpm2_createek): our credential opens with tpm2_activatecredential', async () => {
    const d = path.join(work, 'tools-ecc');
    mkdirSync(d);
    const f = (n: string) => path.join(d, n);
    const secret = randomBytes(32);
    await withTools(async () => {
      await tool('tpm2_createek', ['-c', f('ek.ctx'), '-G', 'ecc', '-u', f('ek.pub')]);
      await tool('tpm2_flushcontext', ['-t']);
      const pub = readFileSync(f('ek.pub')).subarray(2);
      // ECC, sha256, then (after attributes and the 32-byte policy) AES-128-CFB, and a P-256 point at the end.
      expect(pub.subarray(0, 4).toString('hex')).toBe('0023000b');
      expect(pub.subarray(42, 48).toString('hex')).toBe('000600800043');
      const x = pub.subarray(pub.length - 66, pub.length - 34);
      const y = pub.subarray(pub.length - 32);
      expect(pub.readUInt16BE(pub.length - 68)).toBe(32);
      const ekKey = createPublicKey({
        key: { kty: 'EC', crv: 'P-256', x: x.toString('base64url'), y: y.toString('base64url') },
        format: 'jwk',
      });
      await tool('tpm2_createak', [
        '-C',
        f('ek.ctx'),
        '-c',
        f('ak.ctx'),
        '-G',
        'ecc',
        '-g',
        'sha256',
        '-s',
        'ecdsa',
        '-u',
        f('ak.pub'),
        '-n',
        f('ak.name'),
      ]);
      await tool('tpm2_flushcontext', ['-t']);
      const akName = readFileSync(f('ak.name'));
      const activate = async (c: MadeCredential, out: string) => {
        writeFileSync(f(`${out}.cred`), toolsCredentialFile(c));
        await tool('tpm2_startauthsession', ['--policy-session', '-S', f('session.ctx')]);
        try {
          await tool('tpm2_policysecret', ['-S', f('session.ctx'), '-c', 'e']);
          return await run(
            '/usr/bin/tpm2_activatecredential',
            ['-c', f('ak.ctx'), '-C', f('ek.ctx'), '-i', f(`${out}.cred`), '-o', f(`${out}.out`), '-P', `session:${f('session.ctx')}`],
            toolEnv(),
          );
        } finally {
          await run('/usr/bin/tpm2_flushcontext', [f('session.ctx')], toolEnv());
          await run('/usr/bin/tpm2_flushcontext', ['-t'], toolEnv());
        }
      };
      const ok = await activate(makeCredential(ekKey, akName, secret), 'ours');
      expect(ok.code, ok.stderr).toBe(0);
      expect(readFileSync(f('ours.out'))).toEqual(secret);
      // The same credential for another name does not open.
      const other = Buffer.from(akName);
      other[other.length - 1] = (other[other.length - 1] ?? 0) ^ 1;
      const refused = await activate(makeCredential(ekKey, other, secret), 'other');
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toMatch(/integrity/i);
    });
  });

  it('refuses credentials for another key, another TPM, or altered ones, as a coded error; nothing stays loaded', async () => {
    const ekKey = ekPublicKeyFromCertificate(await client().ekCertificate());
    const ak = await client().akPublic();
    const secret = randomBytes(32);
    const refused = async (c: MadeCredential, what: RegExp) => {
      const err = await rejection(client().activateCredential(c.credentialBlob, c.encryptedSecret));
      expect(err.reason, err.message).toBe('TPM_CREDENTIAL_REFUSED');
      expect(err.message).toMatch(what);
    };

    // Another key of the same TPM (the owner hierarchy's AK): refused for the endorsement AK,
    // opened by the key it names: the name is what binds.
    const ownerAk = await client().akPublic(TPM_RH_OWNER);
    expect(ownerAk.name.equals(ak.name)).toBe(false);
    const forOwner = makeCredential(ekKey, ownerAk.name, secret);
    await refused(forOwner, /TPM_RC_INTEGRITY on the credential blob/);
    expect(await client().activateCredential(forOwner.credentialBlob, forOwner.encryptedSecret, TPM_RH_OWNER)).toEqual(secret);

    // Another TPM's EK (certified by the same CA): this TPM cannot open the seed.
    await refused(makeCredential(ekPublicKeyFromCertificate(otherEkCertFile), ak.name, secret), /encrypted secret/);

    const good = makeCredential(ekKey, ak.name, secret);
    const flip = (b: Buffer, at: number) => {
      const c = Buffer.from(b);
      c[at] = (c[at] ?? 0) ^ 0x01;
      return c;
    };
    // A byte of the outer HMAC, of the encrypted secret, of the RSA-encrypted seed.
    await refused({ ...good, credentialBlob: flip(good.credentialBlob, 10) }, /TPM_RC_INTEGRITY on the credential blob/);
    await refused({ ...good, credentialBlob: flip(good.credentialBlob, good.credentialBlob.length - 1) }, /TPM_RC_INTEGRITY/);
    await refused({ ...good, encryptedSecret: flip(good.encryptedSecret, 100) }, /encrypted secret/);
    // The seed of another credential for the same EK and AK: the HMAC key differs.
    await refused({ ...good, encryptedSecret: makeCredential(ekKey, ak.name, secret).encryptedSecret }, /TPM_RC_INTEGRITY/);

    // Framing the guest checks itself, before the TPM sees anything.
    const short = await rejection(
      client().activateCredential(good.credentialBlob.subarray(0, good.credentialBlob.length - 1), good.encryptedSecret),
    );
    expect(short.reason).toBe('TPM_REQUEST_INVALID');
    expect(short.message).toMatch(/credentialBlob/);
    const long = await rejection(
      client().activateCredential(good.credentialBlob, Buffer.concat([good.encryptedSecret, Buffer.alloc(600)])),
    );
    expect(long.reason).toBe('TPM_REQUEST_INVALID');
    expect(long.message).toMatch(/encryptedSecret/);

    // Still good afterwards, and every path flushed what it made.
    expect(await client().activateCredential(good.credentialBlob, good.encryptedSecret)).toEqual(secret);
    await withTools(async () => {
      for (const cap of ['handles-transient', 'handles-loaded-session', 'handles-saved-session'])
        expect((await tool('tpm2_getcap', [cap])).trim(), cap).toBe('');
    });
  });
});
