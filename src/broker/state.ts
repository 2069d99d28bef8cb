/**
 * The broker's state directory (default /var/lib/kata-ts/broker, 0700, its owner's):
 *
 *   tls/key.pem          the HTTPS key (EC P-256, 0600)
 *   tls/cert.pem         the self-signed HTTPS certificate (0644): what a pod's initdata carries
 *   token-key.pem        the key the broker signs attestation tokens with (EC P-256 PKCS#8, 0600)
 *   policy.json          kata-ts/broker-policy/v1 (policy.ts), replaced atomically
 *   references/<name>.json   kata-ts/reference-values/v1 documents, one per reference set (0600)
 *   resources/<repository>/<type>/<tag>   resource bytes (0600; dirs 0700)
 *   decisions.log        one JSON line per decision (decisions.ts), appended, 0600
 *   tpm-ca-bundle.pem    optional: the EK CA certificates the tpm verifier trusts
 *
 * `init` makes all of it or nothing: the TLS pair is made by openssl in a temporary directory and
 * renamed into place, and a directory `init` created is removed again when a later step fails.
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { errnoCode, invalid, precondition, unavailable } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import { selfSignedEcCertArgv } from '../common/openssl-argv.js';
import { BROKER_POLICY_SCHEMA, type BrokerPolicy } from './policy.js';
import './reasons.js';

/** Where the broker keeps its state unless --dir says otherwise. */
export const DEFAULT_BROKER_DIR = '/var/lib/kata-ts/broker';
/** The HTTPS certificate's lifetime. */
export const BROKER_CERT_VALIDITY_DAYS = 825;
/** The SANs of a certificate made without --san: reachable from the host itself only. */
export const DEFAULT_BROKER_SANS: readonly string[] = ['DNS:localhost', 'IP:127.0.0.1'];

const OPENSSL = 'openssl';
const TOOL_TIMEOUT_MS = 60_000;

/** Every file of the state directory, by role. */
export interface BrokerPaths {
  root: string;
  tlsDir: string;
  tlsKey: string;
  tlsCert: string;
  tokenKey: string;
  policy: string;
  referencesDir: string;
  resourcesDir: string;
  decisionsLog: string;
  tpmCaBundle: string;
}

/** Pure: the paths of a state directory. */
export function brokerPaths(root: string): BrokerPaths {
  const tlsDir = path.join(root, 'tls');
  return {
    root,
    tlsDir,
    tlsKey: path.join(tlsDir, 'key.pem'),
    tlsCert: path.join(tlsDir, 'cert.pem'),
    tokenKey: path.join(root, 'token-key.pem'),
    policy: path.join(root, 'policy.json'),
    referencesDir: path.join(root, 'references'),
    resourcesDir: path.join(root, 'resources'),
    decisionsLog: path.join(root, 'decisions.log'),
    tpmCaBundle: path.join(root, 'tpm-ca-bundle.pem'),
  };
}

/** Pure: the dir must be a normalised absolute path other than /. */
export function validateBrokerDir(dir: string): string {
  if (!path.isAbsolute(dir) || path.normalize(dir) !== dir || dir === '/' || dir.endsWith('/'))
    throw invalid('BROKER_STATE_INVALID', `--dir ${JSON.stringify(dir)} must be a normalised absolute path other than /`, {
      details: { field: 'dir', value: dir },
    });
  return dir;
}

const DNS_NAME = /^(?:\*\.)?[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$/;

/**
 * Pure: checks `--san` entries (`DNS:name` or `IP:address`, each entry possibly a comma-separated
 * list) and answers them one per element; none given is DEFAULT_BROKER_SANS.
 */
export function parseSans(values: readonly string[]): string[] {
  const out: string[] = [];
  for (const value of values.flatMap((v) => v.split(','))) {
    const entry = value.trim();
    const m = /^(DNS|IP):(.+)$/.exec(entry);
    const kind = m?.[1];
    const name = m?.[2] ?? '';
    const ok = kind === 'DNS' ? name.length <= 253 && DNS_NAME.test(name) : kind === 'IP' ? net.isIP(name) !== 0 : false;
    if (!ok)
      throw invalid('BROKER_SAN_INVALID', `--san ${JSON.stringify(entry)} must be DNS:<host name> or IP:<IPv4 or IPv6 address>`, {
        details: { field: 'san', value: entry },
      });
    if (!out.includes(entry)) out.push(entry);
  }
  return out.length === 0 ? [...DEFAULT_BROKER_SANS] : out;
}

/** Pure: openssl's argv for the self-signed HTTPS certificate (EC P-256, unencrypted key: the file is 0600). */
export function tlsCreateArgv(dir: string, sans: readonly string[]): string[] {
  return selfSignedEcCertArgv({
    keyPath: path.join(dir, 'key.pem'),
    certPath: path.join(dir, 'cert.pem'),
    days: BROKER_CERT_VALIDITY_DAYS,
    subject: '/O=kata-ts/CN=kata-ts attestation broker',
    extensions: [`subjectAltName=${sans.join(',')}`, 'keyUsage=critical,digitalSignature', 'extendedKeyUsage=serverAuth'],
  });
}

/** Pure: the policy a new state directory starts with: nothing is released. */
export function emptyPolicy(): BrokerPolicy {
  return { schema: BROKER_POLICY_SCHEMA, resources: [] };
}

function runOpenssl(args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(OPENSSL, args, { timeout: TOOL_TIMEOUT_MS }, (err, _stdout, stderr) => {
      if (err) reject(unavailable('BROKER_TLS_CREATE_FAILED', `openssl req failed: ${stderr.trim() || err.message}`, { cause: err }));
      else resolve();
    });
  });
}

/** The dir exists as a real directory of this user's, 0700. */
export async function checkBrokerDir(root: string): Promise<void> {
  let st: Awaited<ReturnType<typeof fsp.lstat>>;
  try {
    st = await fsp.lstat(root);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT')
      throw precondition('BROKER_STATE_INVALID', `broker state dir ${root} does not exist; run kata-ts broker init --dir ${root}`, {
        details: { field: 'dir', value: root },
      });
    throw err;
  }
  if (!st.isDirectory() || st.uid !== process.getuid?.())
    throw precondition('BROKER_STATE_INVALID', `broker state dir ${root} is not a directory this user owns (a link is never followed)`, {
      details: { field: 'dir', value: root },
    });
  if ((st.mode & 0o077) !== 0)
    throw precondition(
      'BROKER_STATE_INVALID',
      `broker state dir ${root} is open to others (mode ${(st.mode & 0o777).toString(8)}); it must be 0700`,
      {
        details: { field: 'dir', value: root },
      },
    );
}

/** Whether the dir holds a complete state (the TLS pair is the last thing init renames into place). */
async function initialised(paths: BrokerPaths): Promise<boolean> {
  try {
    await fsp.access(paths.tlsCert);
    return true;
  } catch {
    return false;
  }
}

/**
 * `kata-ts broker init`: creates the state directory, or keeps a complete one as it is (its
 * certificate and keys are never replaced: pods carry that certificate). Answers whether it made
 * one.
 */
export async function initBrokerState(root: string, sans: readonly string[]): Promise<{ created: boolean; paths: BrokerPaths }> {
  validateBrokerDir(root);
  const paths = brokerPaths(root);
  let madeRoot = false;
  await fsp.mkdir(path.dirname(root), { recursive: true, mode: 0o755 });
  try {
    await fsp.mkdir(root, { mode: 0o700 });
    madeRoot = true;
  } catch (err) {
    if (errnoCode(err) !== 'EEXIST') throw err;
  }
  try {
    if (!madeRoot) {
      await checkBrokerDir(root);
      if (await initialised(paths)) return { created: false, paths };
    }
    await fsp.mkdir(paths.referencesDir, { recursive: true, mode: 0o700 });
    await fsp.mkdir(paths.resourcesDir, { recursive: true, mode: 0o700 });
    const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
    await writeFileAtomic(paths.tokenKey, privateKey.export({ format: 'pem', type: 'pkcs8' }) as string, 0o600);
    if ((await fsp.readFile(paths.policy, 'utf8').catch(() => undefined)) === undefined)
      await writeFileAtomic(paths.policy, `${JSON.stringify(emptyPolicy(), null, 2)}\n`, 0o600);
    const tmp = await fsp.mkdtemp(path.join(root, '.tls-'));
    try {
      await fsp.chmod(tmp, 0o700);
      await runOpenssl(tlsCreateArgv(tmp, sans));
      await fsp.chmod(path.join(tmp, 'key.pem'), 0o600);
      await fsp.chmod(path.join(tmp, 'cert.pem'), 0o644);
      await fsp.rm(paths.tlsDir, { recursive: true, force: true });
      await fsp.rename(tmp, paths.tlsDir);
    } catch (err) {
      await fsp.rm(tmp, { recursive: true, force: true });
      throw err;
    }
    return { created: true, paths };
  } catch (err) {
    if (madeRoot) await fsp.rm(root, { recursive: true, force: true });
    throw err;
  }
}
