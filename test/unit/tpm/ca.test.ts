/**
 * The node's EK CA: its config builders (pure) and init/rotate/read on temporary roots with the
 * real openssl: generations, the bundle (current, then previous), the drop on the second rotation,
 * and refusals that change nothing.
 */
import { X509Certificate } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  bundleText,
  caCreateArgv,
  caSubject,
  generationDir,
  initTpmCa,
  localcaConfigText,
  parseCaState,
  readTpmCa,
  rotateTpmCa,
  setupConfigText,
  validateCaRoot,
} from '../../../src/tpm/ca.js';
import { rejection, thrown } from '../../helpers/kata-error.js';

describe('the CA config builders', () => {
  it("point swtpm-localca at the generation's own key, certificate and serial (never /var/lib/swtpm-localca)", () => {
    expect(localcaConfigText('/ca/gen-3')).toBe(
      'statedir = /ca/gen-3\nsigningkey = /ca/gen-3/signkey.pem\nissuercert = /ca/gen-3/issuercert.pem\ncertserial = /ca/gen-3/certserial\n',
    );
    const setup = setupConfigText('/ca/gen-3');
    expect(setup).toContain('create_certs_tool = /usr/bin/swtpm_localca\n');
    expect(setup).toContain('create_certs_tool_config = /ca/gen-3/swtpm-localca.conf\n');
    expect(setup).toContain('create_certs_tool_options = /ca/gen-3/swtpm-localca.options\n');
    expect(setup).toContain('active_pcr_banks = sha256\n');
    expect(setup).not.toContain('/etc/');
  });

  it('names each generation, with a hostname reduced to what a DN needs no escape for', () => {
    expect(caSubject(4, 'node-1.example')).toBe('/O=kata-ts/OU=node-1.example/CN=kata-ts node TPM EK CA 4');
    expect(caSubject(1, 'a/b=c,d')).toBe('/O=kata-ts/OU=a-b-c-d/CN=kata-ts node TPM EK CA 1');
  });

  it('makes a CA certificate that may sign end certificates only', () => {
    const argv = caCreateArgv('/ca/.gen-1-x', '/CN=x');
    expect(argv.slice(0, 2)).toEqual(['req', '-x509']);
    expect(argv).toContain('basicConstraints=critical,CA:TRUE,pathlen:0');
    expect(argv).toContain('keyUsage=critical,keyCertSign,cRLSign');
    expect(argv[argv.indexOf('-keyout') + 1]).toBe('/ca/.gen-1-x/signkey.pem');
  });

  it('reads a state file and refuses anything else', () => {
    expect(parseCaState('{"current":2,"previous":1}')).toEqual({ current: 2, previous: 1 });
    expect(parseCaState('{"current":1,"previous":null}')).toEqual({ current: 1, previous: null });
    for (const bad of ['', '{}', '{"current":0,"previous":null}', '{"current":2,"previous":2}', '{"current":"2","previous":null}']) {
      expect(parseCaState(bad), bad).toBeUndefined();
    }
  });

  it('refuses a root that swtpm config lines could not hold, naming caDir', () => {
    for (const bad of ['relative', '/', '/a b', '/a,b', '/a=b', '/a/../b']) {
      const err = thrown(() => validateCaRoot(bad));
      expect(err.reason, bad).toBe('TPM_CA_DIR_INVALID');
      expect(err.message).toContain('caDir');
    }
  });

  it('bundles current first, then previous', () => {
    expect(bundleText('A\n', 'B')).toBe('A\nB\n');
    expect(bundleText('A', null)).toBe('A\n');
  });
});

describe('init, rotate and read on a temporary root (real openssl)', () => {
  let tmp: string;
  beforeEach(async () => {
    tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-tpm-ca-'));
  });
  afterEach(async () => {
    await fsp.rm(tmp, { recursive: true, force: true });
  });

  it('init makes generation 1 (dir 0700, key 0600, a CA certificate), and keeps it when run again', async () => {
    const root = path.join(tmp, 'ca');
    const first = await initTpmCa(root);
    expect(first.created).toBe(true);
    expect(first.ca.current.generation).toBe(1);
    expect(first.ca.previous).toBeNull();
    expect((await fsp.stat(root)).mode & 0o777).toBe(0o700);
    expect((await fsp.stat(path.join(generationDir(root, 1), 'signkey.pem'))).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(first.ca.current.certPem);
    expect(cert.ca).toBe(true);
    expect(cert.verify(cert.publicKey)).toBe(true);
    const again = await initTpmCa(root);
    expect(again.created).toBe(false);
    expect(again.ca.current.certPem).toBe(first.ca.current.certPem);
    expect(await fsp.readFile(path.join(root, 'bundle.pem'), 'utf8')).toBe(first.ca.bundlePem);
  });

  it('rotate keeps the previous generation in the bundle and drops the one before it', async () => {
    const root = path.join(tmp, 'ca');
    const g1 = (await initTpmCa(root)).ca.current;
    const r2 = await rotateTpmCa(root);
    expect(r2.dropped).toBeNull();
    expect([r2.ca.current.generation, r2.ca.previous?.generation]).toEqual([2, 1]);
    expect(r2.ca.bundlePem).toBe(bundleText(r2.ca.current.certPem, g1.certPem));
    const r3 = await rotateTpmCa(root);
    expect(r3.dropped).toBe(1);
    expect([r3.ca.current.generation, r3.ca.previous?.generation]).toEqual([3, 2]);
    expect(r3.ca.bundlePem).not.toContain(g1.certPem.trim());
    expect((await fsp.readdir(root)).sort()).toEqual(['bundle.pem', 'gen-2', 'gen-3', 'state.json']);
    expect(await readTpmCa(root)).toEqual(r3.ca);
  });

  it('read before init is TPM_CA_MISSING and says how to make one; rotate then changes nothing', async () => {
    const root = path.join(tmp, 'none');
    expect((await rejection(readTpmCa(root))).reason).toBe('TPM_CA_MISSING');
    expect((await rejection(rotateTpmCa(root))).message).toContain('kata-ts tpm-ca init');
    await expect(fsp.stat(root)).rejects.toThrow();
  });

  it('a root that is a symbolic link is refused and its target left alone', async () => {
    const target = path.join(tmp, 'elsewhere');
    await fsp.mkdir(target, { mode: 0o755 });
    await fsp.symlink(target, path.join(tmp, 'link'));
    expect((await rejection(initTpmCa(path.join(tmp, 'link')))).reason).toBe('TPM_CA_DIR_INVALID');
    expect(await fsp.readdir(target)).toEqual([]);
    expect((await fsp.stat(target)).mode & 0o777).toBe(0o755);
  });

  it('a corrupt state file is TPM_CA_CORRUPT, never a silent new CA', async () => {
    const root = path.join(tmp, 'ca');
    await initTpmCa(root);
    await fsp.writeFile(path.join(root, 'state.json'), 'junk');
    expect((await rejection(readTpmCa(root))).reason).toBe('TPM_CA_CORRUPT');
    expect((await rejection(initTpmCa(root))).reason).toBe('TPM_CA_CORRUPT');
  });
});
