/**
 * The node's certificate authority for the EK certificates of its pods' swtpms.
 *
 * Layout under the root (default /var/lib/kata-ts/tpm-ca, 0700, root's):
 *   gen-<n>/            one CA generation (0700): signkey.pem (0600, the CA key), issuercert.pem,
 *                       certserial, and the private swtpm_setup / swtpm-localca config files that
 *                       point swtpm's own tooling at exactly these files (/etc is never read or edited)
 *   state.json          { current: n, previous: n | null }, replaced atomically
 *   bundle.pem          the current CA certificate, then the previous one: what a verifier loads
 *
 * Rotation makes generation n+1 current (new pods' EK certificates are signed by it), keeps the
 * one that was current as `previous` (pods started before still present certificates it signed)
 * and deletes the generation before that: pods older than two rotations keep running, but their
 * EK certificates no longer verify against the bundle.
 *
 * The CA key is used only by swtpm_localca, which swtpm_setup runs as root before the pod's swtpm
 * starts; it is never copied into a pod's directory or jail.
 */
import { execFile } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { errnoCode, errorMessage, internal, invalid, precondition, unavailable } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import { selfSignedEcCertArgv } from '../common/openssl-argv.js';
import './reasons.js';

/** Where the node's EK CA lives unless the config (hypervisor.tpm.caDir) says otherwise. */
export const DEFAULT_TPM_CA_DIR = '/var/lib/kata-ts/tpm-ca';
/** The CA certificate's lifetime; the EK certificates it signs carry the TCG's "no expiry" date. */
export const TPM_CA_VALIDITY_DAYS = 3650;

const STATE_FILE = 'state.json';
const BUNDLE_FILE = 'bundle.pem';
const SIGNING_KEY = 'signkey.pem';
const ISSUER_CERT = 'issuercert.pem';
const CERT_SERIAL = 'certserial';
const LOCALCA_CONFIG = 'swtpm-localca.conf';
const LOCALCA_OPTIONS = 'swtpm-localca.options';
const SETUP_CONFIG = 'swtpm_setup.conf';
const OPENSSL = 'openssl';
const SWTPM_LOCALCA = '/usr/bin/swtpm_localca';
const TOOL_TIMEOUT_MS = 60_000;

/** One CA generation as a pod start or a verifier needs it. */
export interface TpmCaGeneration {
  generation: number;
  dir: string;
  /** The CA certificate (PEM). */
  certPem: string;
  /** The swtpm_setup `--config` file whose swtpm-localca config signs with this generation's key. */
  setupConfigFile: string;
}

export interface TpmCa {
  root: string;
  current: TpmCaGeneration;
  previous: TpmCaGeneration | null;
  /** Current then previous CA certificate, PEM: the trust anchors of every running pod's EK certificate. */
  bundlePem: string;
}

interface CaState {
  current: number;
  previous: number | null;
}

/** Pure: the root must be a plain absolute path (it is written into swtpm's key = value config files). */
export function validateCaRoot(root: string): void {
  if (!path.isAbsolute(root) || path.normalize(root) !== root || /[\s,=\\]/.test(root) || root === '/') {
    throw invalid(
      'TPM_CA_DIR_INVALID',
      `tpm caDir ${JSON.stringify(root)} must be a normalised absolute path other than / without whitespace, commas, '=' or backslashes.`,
      { details: { field: 'caDir', value: root } },
    );
  }
}

/** Pure: the dir of generation `n`. */
export function generationDir(root: string, n: number): string {
  return path.join(root, `gen-${n}`);
}

/** Pure: swtpm-localca's config for one generation: its key, certificate and serial counter, nothing of /var/lib/swtpm-localca. */
export function localcaConfigText(genDir: string): string {
  return [
    `statedir = ${genDir}`,
    `signingkey = ${path.join(genDir, SIGNING_KEY)}`,
    `issuercert = ${path.join(genDir, ISSUER_CERT)}`,
    `certserial = ${path.join(genDir, CERT_SERIAL)}`,
    '',
  ].join('\n');
}

/** Pure: what swtpm-localca writes into the platform certificate. */
export function localcaOptionsText(): string {
  return ['--platform-manufacturer kata-ts', '--platform-version 1', '--platform-model QEMU', ''].join('\n');
}

/** Pure: the private swtpm_setup config (replaces /etc/swtpm_setup.conf for our pods). */
export function setupConfigText(genDir: string, localca = SWTPM_LOCALCA): string {
  return [
    `create_certs_tool = ${localca}`,
    `create_certs_tool_config = ${path.join(genDir, LOCALCA_CONFIG)}`,
    `create_certs_tool_options = ${path.join(genDir, LOCALCA_OPTIONS)}`,
    'active_pcr_banks = sha256',
    '',
  ].join('\n');
}

/** Pure: the subject of generation `n` (hostname reduced to characters a DN needs no escape for). */
export function caSubject(n: number, hostname: string): string {
  const host = hostname.replace(/[^A-Za-z0-9.-]/g, '-').slice(0, 48) || 'node';
  return `/O=kata-ts/OU=${host}/CN=kata-ts node TPM EK CA ${n}`;
}

/** Pure: openssl's argv for a self-signed CA (EC P-256 key, unencrypted: the file is root's 0600). */
export function caCreateArgv(dir: string, subject: string): string[] {
  return selfSignedEcCertArgv({
    keyPath: path.join(dir, SIGNING_KEY),
    certPath: path.join(dir, ISSUER_CERT),
    days: TPM_CA_VALIDITY_DAYS,
    subject,
    extensions: ['basicConstraints=critical,CA:TRUE,pathlen:0', 'keyUsage=critical,keyCertSign,cRLSign'],
  });
}

/** Pure: the state file's content, or undefined when it is not one. */
export function parseCaState(text: string): CaState | undefined {
  try {
    const doc = JSON.parse(text) as { current?: unknown; previous?: unknown };
    const ok = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 1;
    if (!ok(doc.current)) return undefined;
    if (doc.previous !== null && !ok(doc.previous)) return undefined;
    if (doc.previous === doc.current) return undefined;
    return { current: doc.current as number, previous: (doc.previous ?? null) as number | null };
  } catch {
    return undefined;
  }
}

function run(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: TOOL_TIMEOUT_MS }, (err, _stdout, stderr) => {
      if (err) reject(unavailable('TPM_CA_CREATE_FAILED', `${file} ${args[0]} failed: ${stderr.trim() || err.message}.`, { cause: err }));
      else resolve();
    });
  });
}

/** The root exists as a real directory of root's, 0700 (made when missing; a link or a foreign dir is refused). */
async function ensureRoot(root: string): Promise<void> {
  await fsp.mkdir(path.dirname(root), { recursive: true, mode: 0o755 });
  try {
    await fsp.mkdir(root, { mode: 0o700 });
  } catch (err) {
    if (errnoCode(err) !== 'EEXIST') throw err;
  }
  const st = await fsp.lstat(root);
  if (!st.isDirectory() || st.uid !== process.getuid?.()) {
    throw precondition(
      'TPM_CA_DIR_INVALID',
      `tpm caDir ${root} is not a directory this user owns (a link or another's dir is never used).`,
      {
        details: { field: 'caDir', value: root },
      },
    );
  }
  await fsp.chmod(root, 0o700);
}

/** Make generation `n` in a temporary dir and rename it into place (all or nothing). */
async function createGeneration(root: string, n: number): Promise<void> {
  const tmp = await fsp.mkdtemp(path.join(root, `.gen-${n}-`));
  try {
    await fsp.chmod(tmp, 0o700);
    await run(OPENSSL, caCreateArgv(tmp, caSubject(n, os.hostname())));
    await fsp.chmod(path.join(tmp, SIGNING_KEY), 0o600);
    await fsp.chmod(path.join(tmp, ISSUER_CERT), 0o644);
    const dir = generationDir(root, n);
    // The files name their final dir: written before the rename, valid after it.
    await fsp.writeFile(path.join(tmp, CERT_SERIAL), '1\n', { mode: 0o600 });
    await fsp.writeFile(path.join(tmp, LOCALCA_CONFIG), localcaConfigText(dir), { mode: 0o600 });
    await fsp.writeFile(path.join(tmp, LOCALCA_OPTIONS), localcaOptionsText(), { mode: 0o600 });
    await fsp.writeFile(path.join(tmp, SETUP_CONFIG), setupConfigText(dir), { mode: 0o600 });
    try {
      await fsp.rename(tmp, dir);
    } catch (err) {
      if (errnoCode(err) === 'EEXIST' || errnoCode(err) === 'ENOTEMPTY') {
        throw precondition(
          'TPM_CA_BUSY',
          `TPM CA generation ${n} appeared meanwhile in ${root}: another init or rotate ran at the same time.`,
        );
      }
      throw err;
    }
  } catch (err) {
    await fsp.rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

async function readState(root: string): Promise<CaState | undefined> {
  let text: string;
  try {
    text = await fsp.readFile(path.join(root, STATE_FILE), 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
  const state = parseCaState(text);
  if (state === undefined) throw internal('TPM_CA_CORRUPT', `${path.join(root, STATE_FILE)} is not a TPM CA state file.`);
  return state;
}

async function readGeneration(root: string, n: number): Promise<TpmCaGeneration> {
  const dir = generationDir(root, n);
  try {
    const certPem = await fsp.readFile(path.join(dir, ISSUER_CERT), 'utf8');
    new X509Certificate(certPem);
    await fsp.access(path.join(dir, SIGNING_KEY));
    const setupConfigFile = path.join(dir, SETUP_CONFIG);
    await fsp.access(setupConfigFile);
    return { generation: n, dir, certPem, setupConfigFile };
  } catch (err) {
    throw internal('TPM_CA_CORRUPT', `TPM CA generation ${n} in ${dir} is incomplete or unreadable: ${errorMessage(err)}.`, { cause: err });
  }
}

/** Pure: the bundle a verifier loads, current first. */
export function bundleText(current: string, previous: string | null): string {
  return [current, previous]
    .filter((c): c is string => c !== null)
    .map((c) => (c.endsWith('\n') ? c : `${c}\n`))
    .join('');
}

/** The node's CA as it is now. Throws TPM_CA_MISSING before `kata-ts tpm-ca init`. */
export async function readTpmCa(root: string = DEFAULT_TPM_CA_DIR): Promise<TpmCa> {
  validateCaRoot(root);
  const state = await readState(root);
  if (state === undefined) {
    throw precondition('TPM_CA_MISSING', `the node has no TPM EK CA in ${root}: run \`kata-ts tpm-ca init\` (scripts/setup.sh does).`, {
      details: { field: 'caDir', value: root },
    });
  }
  const current = await readGeneration(root, state.current);
  const previous = state.previous === null ? null : await readGeneration(root, state.previous).catch(() => null);
  return { root, current, previous, bundlePem: bundleText(current.certPem, previous?.certPem ?? null) };
}

/** Create the CA when there is none (generation 1); an existing one is kept. */
export async function initTpmCa(root: string = DEFAULT_TPM_CA_DIR): Promise<{ created: boolean; ca: TpmCa }> {
  validateCaRoot(root);
  await ensureRoot(root);
  if ((await readState(root)) !== undefined) return { created: false, ca: await readTpmCa(root) };
  await createGeneration(root, 1);
  const first = await readGeneration(root, 1);
  await writeFileAtomic(path.join(root, BUNDLE_FILE), bundleText(first.certPem, null), 0o644);
  await writeFileAtomic(path.join(root, STATE_FILE), `${JSON.stringify({ current: 1, previous: null })}\n`, 0o600);
  return { created: true, ca: await readTpmCa(root) };
}

/**
 * A new generation becomes current; the one that was current is kept as previous; the one before
 * that is deleted (its pods' EK certificates stop verifying against the bundle). Order: the bundle
 * names the new CA before any pod can be signed by it, and the old previous goes last.
 */
export async function rotateTpmCa(root: string = DEFAULT_TPM_CA_DIR): Promise<{ ca: TpmCa; dropped: number | null }> {
  validateCaRoot(root);
  const before = await readTpmCa(root);
  const next = Math.max(before.current.generation, before.previous?.generation ?? 0) + 1;
  await createGeneration(root, next);
  const made = await readGeneration(root, next);
  await writeFileAtomic(path.join(root, BUNDLE_FILE), bundleText(made.certPem, before.current.certPem), 0o644);
  await writeFileAtomic(path.join(root, STATE_FILE), `${JSON.stringify({ current: next, previous: before.current.generation })}\n`, 0o600);
  const dropped = before.previous?.generation ?? null;
  // Every other generation dir (the dropped one, leftovers of an interrupted run) goes.
  for (const entry of await fsp.readdir(root)) {
    const m = /^\.?gen-([0-9]+)(-.*)?$/.exec(entry);
    if (m === null) continue;
    const n = Number(m[1]);
    if (m[2] === undefined && (n === next || n === before.current.generation)) continue;
    if (m[2] !== undefined && n === next) continue;
    await fsp.rm(path.join(root, entry), { recursive: true, force: true });
  }
  return { ca: await readTpmCa(root), dropped };
}
