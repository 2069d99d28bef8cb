/**
 * A pod's swtpm: its TPM 2.0 state made (with EK certificates signed by the node's CA) by
 * swtpm_setup, then swtpm started detached, confined like QEMU and as an identity of its own.
 *
 * Why its own identity: QEMU is the process a hostile guest may take over. Were swtpm's state
 * QEMU's to write, that QEMU could rewrite the PCRs and the EK and quote whatever it likes; so
 * the state dir is swtpm's (0700) and QEMU only reaches the control socket (group QEMU's, 0660,
 * in a dir swtpm owns that QEMU's group may enter). swtpm runs through the same chain as QEMU
 * (src/hypervisor/confine.ts vmmLaunchCommand): kata-ts-jailer (its own mount namespace rooted at
 * a jail holding /usr, a small /dev, its state dir and its socket dir; IPC and network
 * namespaces of its own; resource limits), then setpriv (its uid and gid, no supplementary
 * groups, no capabilities, no_new_privs), then swtpm with its own seccomp filter killing on any
 * syscall outside its list. The caller builds the jail (swtpmJailSpec + the sandbox's buildJail).
 *
 * swtpm_setup runs as root in a root-only staging dir (it calls swtpm_localca, which reads the
 * CA key); only the finished state file is handed to swtpm's identity and moved into its state
 * dir, so root never writes into a dir an unprivileged process controls and the CA key never
 * enters the pod's directory or jail.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes, X509Certificate } from 'node:crypto';
import { closeSync, promises as fsp, openSync, type Stats, writeSync } from 'node:fs';
import path from 'node:path';
import type { Writable } from 'node:stream';
import { errnoCode, errorMessage, invalid, precondition, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { chmodSocketNoFollow, chownSocketNoFollow } from '../common/nofollow.js';
import {
  defaultJailerBinary,
  isSameLiveProcess,
  type JailSpec,
  readProcStat,
  SUN_PATH_MAX_BYTES,
  type VmmIdentity,
  vmmLaunchCommand,
} from '../hypervisor/index.js';
import { tailFile } from '../hypervisor/log-tail.js';
import { readTpmCa } from './ca.js';
import './reasons.js';

export const DEFAULT_SWTPM_BINARY = '/usr/bin/swtpm';
export const DEFAULT_SWTPM_SETUP_BINARY = '/usr/bin/swtpm_setup';
/** The state file of a TPM 2.0 in swtpm's dir backend. */
export const SWTPM_STATE_FILE = 'tpm2-00.permall';
/** The per-pod migration key file, read and deleted by swtpm as it starts. */
export const SWTPM_MIGRATION_KEY_FILE = 'migration.key';
/** What swtpm_setup --write-ek-cert-files names the RSA 2048 EK certificate (the TCG default EK, NV 0x01c00002). */
const EK_RSA_CERT_FILE = 'ek-rsa2048.crt';
/** Mode of the control socket once its group is QEMU's: swtpm's uid and QEMU's gid may connect. */
export const SWTPM_SOCKET_MODE = 0o660;
/** Mode of the socket's dir: swtpm's, entered by QEMU's group only. */
export const SWTPM_SOCKET_DIR_MODE = 0o750;

const DEFAULT_SETUP_TIMEOUT_MS = 120_000;
const DEFAULT_START_TIMEOUT_MS = 15_000;
const DEFAULT_STOP_TIMEOUT_MS = 3_000;
const POLL_MS = 20;
const START_GATE_FD = 3;
/** `Flags` of a listening socket in /proc/net/unix (__SO_ACCEPTCON). */
const UNIX_LISTENING_FLAGS = 0x10000;

export interface StartSwtpmOptions {
  /** swtpm's state dir (in the pod's work dir): made or found empty, then swtpm's own, 0700. */
  stateDir: string;
  /** The control socket QEMU's `-chardev socket,path=` connects to; its dir is made or taken over. */
  ctrlSocketPath: string;
  /** swtpm_setup's and swtpm's log (root's, outside the jail: swtpm writes it through its stdout). */
  logFile: string;
  /** The node's EK CA (src/tpm/ca.ts); its current generation signs this TPM's EK certificates. */
  caDir: string;
  binary?: string;
  setupBinary?: string;
  /** swtpm's own identity (never QEMU's). Requires `jail`. Absent: swtpm runs as root, unconfined. */
  identity?: VmmIdentity;
  /** The jail built for swtpm (swtpmJailSpec, then the sandbox's buildJail for `identity`). */
  jail?: { jailDir: string; jailerBinary?: string };
  /** The identity that may connect to the control socket (QEMU's). */
  clientIdentity?: VmmIdentity;
  /** Put the new process in the pod's cgroup; confined, before swtpm runs (the jailer holds it). */
  place?: (pid: number) => Promise<void>;
  logger: Logger;
  setupTimeoutMs?: number;
  startTimeoutMs?: number;
}

/** A running swtpm; identified by pid + start time (pids are reused). */
export interface SwtpmProcess {
  pid: number;
  startTimeTicks: number;
  ctrlSocketPath: string;
  stateDir: string;
  /** The RSA 2048 EK certificate (PEM) swtpm_setup wrote into the TPM's NV, signed by the node's CA. */
  ekCertPem: string;
  /** Every pid of it (swtpm does not fork): for the pod's cgroup. */
  pids(): number[];
  /** SIGTERM, SIGKILL after `timeoutMs`; then its socket and state are removed. Idempotent. */
  stop(timeoutMs?: number): Promise<void>;
}

/** What a sandbox record keeps to find its swtpm again after a daemon restart. */
export interface SwtpmRecordLike {
  pid: number;
  startTimeTicks: number;
  ctrlSocketPath: string;
  stateDir: string;
  ekCertPem: string;
}

function requireSwtpmPath(field: string, value: string): void {
  // swtpm splits its option values at commas and has no escape for them.
  if (!path.isAbsolute(value) || path.normalize(value) !== value || /[,\n\0]/.test(value) || value === '/') {
    throw invalid('SWTPM_OPTION_INVALID', `swtpm ${field} ${JSON.stringify(value)} must be a normalised absolute path without commas.`, {
      details: { field, value },
    });
  }
}

function requireIdentity(field: string, id: VmmIdentity): void {
  for (const [part, n] of [
    ['uid', id.uid],
    ['gid', id.gid],
  ] as const) {
    if (!Number.isSafeInteger(n) || n < 1 || n > 4_294_967_294) {
      throw invalid('SWTPM_OPTION_INVALID', `swtpm ${field}.${part} must be a number from 1 to 4294967294, not ${n}.`, {
        details: { field: `${field}.${part}`, value: n },
      });
    }
  }
}

/** Pure: the options are whole and safe, or a coded error naming the field. */
export function validateSwtpmOptions(o: StartSwtpmOptions): void {
  requireSwtpmPath('stateDir', o.stateDir);
  requireSwtpmPath('ctrlSocketPath', o.ctrlSocketPath);
  requireSwtpmPath('logFile', o.logFile);
  requireSwtpmPath('binary', o.binary ?? DEFAULT_SWTPM_BINARY);
  if (/\s/.test(o.binary ?? '')) {
    throw invalid(
      'SWTPM_OPTION_INVALID',
      `swtpm binary ${JSON.stringify(o.binary)} must be a path without whitespace (swtpm_setup splits it).`,
      {
        details: { field: 'binary', value: o.binary },
      },
    );
  }
  requireSwtpmPath('setupBinary', o.setupBinary ?? DEFAULT_SWTPM_SETUP_BINARY);
  const bytes = Buffer.byteLength(o.ctrlSocketPath, 'utf8');
  if (bytes > SUN_PATH_MAX_BYTES) {
    throw invalid(
      'SWTPM_OPTION_INVALID',
      `swtpm ctrlSocketPath is ${bytes} bytes long but a unix socket path must fit in ${SUN_PATH_MAX_BYTES}.`,
      {
        details: { field: 'ctrlSocketPath', value: o.ctrlSocketPath },
      },
    );
  }
  const socketDir = path.dirname(o.ctrlSocketPath);
  if (socketDir === o.stateDir || socketDir.startsWith(`${o.stateDir}/`) || o.stateDir.startsWith(`${socketDir}/`)) {
    throw invalid(
      'SWTPM_OPTION_INVALID',
      'swtpm ctrlSocketPath must be in a dir apart from stateDir (QEMU may enter the one, never the other).',
      {
        details: { field: 'ctrlSocketPath', value: o.ctrlSocketPath },
      },
    );
  }
  if (o.identity !== undefined) {
    requireIdentity('identity', o.identity);
    if (o.jail === undefined) {
      throw invalid('SWTPM_JAIL_REQUIRED', 'swtpm jail is required with an identity: build one with swtpmJailSpec and buildJail.', {
        details: { field: 'jail' },
      });
    }
    requireSwtpmPath('jail.jailDir', o.jail.jailDir);
  }
  if (o.jail !== undefined && o.identity === undefined) {
    throw invalid('SWTPM_OPTION_INVALID', 'swtpm identity is required with a jail: the jail is entered as that identity, never as root.', {
      details: { field: 'identity' },
    });
  }
  if (o.clientIdentity !== undefined) {
    requireIdentity('clientIdentity', o.clientIdentity);
    if (o.identity !== undefined && (o.identity.uid === o.clientIdentity.uid || o.identity.gid === o.clientIdentity.gid)) {
      throw invalid(
        'SWTPM_IDENTITY_SHARED',
        `swtpm identity ${o.identity.uid} must not share a uid or gid with its client (QEMU's) identity.`,
        {
          details: { field: 'identity', value: o.identity.uid },
        },
      );
    }
  }
}

/**
 * Pure: swtpm's argv (without the binary). Control channel only (QEMU's tpm-emulator passes the
 * data channel over it and sends CMD_INIT itself; the firmware sends TPM2_Startup, so no
 * `--flags startup-*`); socket mode 0600 until the daemon hands it to QEMU's group; log to the
 * inherited stdout (swtpm refuses fd 2; the log file stays outside the jail); seccomp killing on
 * anything else.
 */
export function buildSwtpmArgv(o: { stateDir: string; ctrlSocketPath: string; logLevel?: number }): string[] {
  requireSwtpmPath('stateDir', o.stateDir);
  requireSwtpmPath('ctrlSocketPath', o.ctrlSocketPath);
  return [
    'socket',
    '--tpm2',
    '--tpmstate',
    `dir=${o.stateDir},mode=0600`,
    // The control channel hands out and takes state blobs (CMD_GET/SET_STATEBLOB, for migration):
    // encrypted and authenticated with a key of this pod's only, QEMU can neither read the EK's
    // private key out of them nor load a state of its making. swtpm reads the key and deletes it.
    '--migration-key',
    `file=${path.join(o.stateDir, SWTPM_MIGRATION_KEY_FILE)},format=hex,mode=aes-256-cbc,remove=true`,
    '--ctrl',
    `type=unixio,path=${o.ctrlSocketPath},mode=0600`,
    '--log',
    `fd=1,level=${o.logLevel ?? 1}`,
    '--seccomp',
    'action=kill',
    // Gone with its QEMU: once the data channel QEMU passed closes, swtpm writes its state and
    // leaves (a crashed VM leaves no swtpm behind). Control connections alone do not end it.
    '--terminate',
  ];
}

/**
 * Pure: swtpm_setup's argv. TPM 2.0, an RSA 2048 and an ECC P-384 EK (swtpm 0.7's default pair),
 * their certificates and a platform certificate from the private config (the node's CA), the
 * sha256 PCR bank only (the bank kata-ts predicts), the EK certificates also written as files.
 */
export function buildSwtpmSetupArgv(o: { stagingDir: string; setupConfigFile: string; swtpmBinary: string }): string[] {
  return [
    '--tpm2',
    '--tpmstate',
    o.stagingDir,
    // swtpm_setup splits this at spaces and runs it as the TPM (the binary's path has none).
    '--tpm',
    `${o.swtpmBinary} socket`,
    '--createek',
    '--create-ek-cert',
    '--create-platform-cert',
    '--config',
    o.setupConfigFile,
    '--pcr-banks',
    'sha256',
    '--write-ek-cert-files',
    o.stagingDir,
    '--logfile',
    path.join(o.stagingDir, 'setup.log'),
    '--not-overwrite',
  ];
}

/**
 * Pure: the jail swtpm runs in (for the sandbox's buildJail): /usr read-only, the small /dev
 * (null, zero, random, urandom; no other device), its state dir read-write at its own path (the
 * jail's "VMM dir"), the control socket's dir read-write at its own path. Nothing else.
 */
export function swtpmJailSpec(o: {
  jailDir: string;
  stateDir: string;
  ctrlSocketPath: string;
  binary?: string;
}): Omit<JailSpec, 'rootLinks'> {
  const binary = o.binary ?? DEFAULT_SWTPM_BINARY;
  return {
    jailDir: o.jailDir,
    vmmDir: o.stateDir,
    files: binary.startsWith('/usr/') ? [] : [binary],
    dirs: [path.dirname(o.ctrlSocketPath)],
    devices: { kvm: false, tun: false, vhostNet: false, vfioGroups: [], vfioFunctions: [], devRoot: '/dev' },
  };
}

function runTool(file: string, args: string[], timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err) {
        reject(
          unavailable(
            'SWTPM_SETUP_FAILED',
            `${file} failed: ${(stderr || stdout).trim().split('\n').slice(-3).join(' ') || err.message}.`,
            {
              cause: err,
            },
          ),
        );
      } else resolve();
    });
  });
}

/** A real directory (not a link) at `dir`: made (`mode`) when missing; returns whether it was made. */
async function ensureDir(field: string, dir: string, mode: number): Promise<boolean> {
  let made = false;
  try {
    await fsp.mkdir(dir, { mode });
    made = true;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') {
      throw precondition('SWTPM_STATE_DIR_UNSAFE', `swtpm ${field} ${dir} cannot be made: its parent dir does not exist.`, {
        details: { field, value: dir },
      });
    }
    if (errnoCode(err) !== 'EEXIST') throw err;
  }
  const st: Stats = await fsp.lstat(dir);
  if (!st.isDirectory()) {
    throw precondition('SWTPM_STATE_DIR_UNSAFE', `swtpm ${field} ${dir} is not a directory (a link is never followed).`, {
      details: { field, value: dir },
    });
  }
  return made;
}

/** The EK certificate (DER) as PEM, checked to be signed by the CA it must chain to. */
export function checkEkCertificate(der: Buffer, caCertPem: string): string {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(der);
  } catch (err) {
    throw unavailable('SWTPM_EK_CERT_INVALID', `swtpm_setup wrote an EK certificate that does not parse: ${errorMessage(err)}.`);
  }
  const ca = new X509Certificate(caCertPem);
  if (!cert.checkIssued(ca) || !cert.verify(ca.publicKey)) {
    throw unavailable(
      'SWTPM_EK_CERT_INVALID',
      `the EK certificate is not signed by the node's TPM CA (${ca.subject.replaceAll('\n', ', ')}).`,
    );
  }
  return cert.toString();
}

/**
 * Start a pod's swtpm (see the file's comment) and resolve once its control socket listens and
 * belongs to the client's group. Every failure leaves nothing it made: no process, staging dir,
 * state file, socket, or dir it created.
 */
export async function startSwtpm(o: StartSwtpmOptions): Promise<SwtpmProcess> {
  validateSwtpmOptions(o);
  const binary = o.binary ?? DEFAULT_SWTPM_BINARY;
  const setupBinary = o.setupBinary ?? DEFAULT_SWTPM_SETUP_BINARY;
  const logger = o.logger.child({ component: 'swtpm' });
  const ca = await readTpmCa(o.caDir);
  const socketDir = path.dirname(o.ctrlSocketPath);
  const undo: Array<() => Promise<unknown>> = [];
  const rollback = async () => {
    for (const step of undo.reverse()) await step().catch((err) => logger.warn({ err: errorMessage(err) }, 'swtpm rollback step failed'));
  };
  try {
    // Dirs: the state dir swtpm's alone; the socket dir swtpm's, entered by the client's group.
    if (await ensureDir('stateDir', o.stateDir, 0o700)) undo.push(() => fsp.rm(o.stateDir, { recursive: true, force: true }));
    if ((await fsp.readdir(o.stateDir)).length > 0) {
      throw precondition('SWTPM_STATE_DIR_UNSAFE', `swtpm stateDir ${o.stateDir} is not empty: a pod's TPM state is always made new.`, {
        details: { field: 'stateDir', value: o.stateDir },
      });
    }
    undo.push(() => fsp.rm(path.join(o.stateDir, SWTPM_STATE_FILE), { force: true }));
    if (await ensureDir('ctrlSocketPath', socketDir, SWTPM_SOCKET_DIR_MODE))
      undo.push(() => fsp.rm(socketDir, { recursive: true, force: true }));
    const owner = o.identity ?? { uid: 0, gid: 0 };
    await fsp.chown(o.stateDir, owner.uid, owner.gid);
    await fsp.chmod(o.stateDir, 0o700);
    await fsp.chown(socketDir, owner.uid, o.clientIdentity?.gid ?? owner.gid);
    await fsp.chmod(socketDir, SWTPM_SOCKET_DIR_MODE);

    // swtpm_setup as root in a root-only dir beside the state dir (see the file's comment).
    const staging = await fsp.mkdtemp(path.join(path.dirname(o.stateDir), '.swtpm-setup-'));
    undo.push(() => fsp.rm(staging, { recursive: true, force: true }));
    await fsp.chmod(staging, 0o700);
    const setupStart = process.hrtime.bigint();
    try {
      await runTool(
        setupBinary,
        buildSwtpmSetupArgv({ stagingDir: staging, setupConfigFile: ca.current.setupConfigFile, swtpmBinary: binary }),
        o.setupTimeoutMs ?? DEFAULT_SETUP_TIMEOUT_MS,
      );
    } catch (err) {
      const log = await tailFile(path.join(staging, 'setup.log'), 5).catch(() => '');
      throw unavailable('SWTPM_SETUP_FAILED', `swtpm_setup could not make the pod's TPM state: ${errorMessage(err)} ${log}`.trim(), {
        cause: err,
      });
    }
    const setupMs = Number(process.hrtime.bigint() - setupStart) / 1e6;
    const ekCertPem = checkEkCertificate(await fsp.readFile(path.join(staging, EK_RSA_CERT_FILE)), ca.current.certPem);
    const stateFile = path.join(staging, SWTPM_STATE_FILE);
    const keyFile = path.join(staging, SWTPM_MIGRATION_KEY_FILE);
    await fsp.writeFile(keyFile, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    for (const file of [stateFile, keyFile]) {
      await fsp.chown(file, owner.uid, owner.gid);
      await fsp.chmod(file, 0o600);
    }
    undo.push(() => fsp.rm(path.join(o.stateDir, SWTPM_MIGRATION_KEY_FILE), { force: true }));
    await fsp.rename(keyFile, path.join(o.stateDir, SWTPM_MIGRATION_KEY_FILE));
    await fsp.rename(stateFile, path.join(o.stateDir, SWTPM_STATE_FILE));
    let logFd: number;
    try {
      logFd = openSync(o.logFile, 'w', 0o640);
    } catch (err) {
      throw precondition('SWTPM_LOG_UNWRITABLE', `swtpm logFile ${o.logFile} cannot be created.`, {
        cause: err,
        details: { field: 'logFile' },
      });
    }
    try {
      const setupLog = await fsp.readFile(path.join(staging, 'setup.log')).catch(() => Buffer.alloc(0));
      writeSync(logFd, setupLog);
      await fsp.rm(staging, { recursive: true, force: true });
      logger.info({ setupMs: Math.round(setupMs), caGeneration: ca.current.generation }, 'swtpm state and EK certificates made');

      await fsp.rm(o.ctrlSocketPath, { force: true });
      undo.push(() => fsp.rm(o.ctrlSocketPath, { force: true }));
      // Only the jailer can hold the start; an unconfined swtpm is placed as soon as it is spawned.
      const gated = o.jail !== undefined && o.identity !== undefined && o.place !== undefined;
      const command = vmmLaunchCommand({
        qemuBinary: binary,
        argv: buildSwtpmArgv({ stateDir: o.stateDir, ctrlSocketPath: o.ctrlSocketPath }),
        ...(o.jail === undefined || o.identity === undefined
          ? {}
          : { jail: { jailDir: o.jail.jailDir, identity: o.identity, jailerBinary: o.jail.jailerBinary ?? defaultJailerBinary() } }),
        ...(gated ? { waitFd: START_GATE_FD } : {}),
      });
      const child = await spawnDetached(command.file, command.args, logFd, gated);
      const pid = child.pid!;
      let exited = false;
      child.once('exit', () => {
        exited = true;
      });
      const stat = readProcStat(pid);
      const handle = makeHandle({
        pid,
        startTimeTicks: stat?.startTimeTicks ?? 0,
        ctrlSocketPath: o.ctrlSocketPath,
        stateDir: o.stateDir,
        ekCertPem,
      });
      undo.push(() => stopProcess(pid, stat?.startTimeTicks ?? 0, 0));
      if (o.place !== undefined) {
        try {
          await o.place(pid);
        } catch (err) {
          throw unavailable('SWTPM_PLACE_FAILED', `swtpm (pid ${pid}) could not be placed in the pod's cgroup: ${errorMessage(err)}.`, {
            cause: err,
          });
        }
      }
      if (gated) await openGate(child).catch(() => undefined);
      const deadline = Date.now() + (o.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS);
      for (;;) {
        if (exited || stat === undefined || !isSameLiveProcess(pid, stat.startTimeTicks)) {
          const log = await tailFile(o.logFile, 20).catch(() => '');
          throw unavailable('SWTPM_EXITED', `swtpm exited before it listened on ${o.ctrlSocketPath}: ${log.trim() || 'no output'}.`, {
            details: { log },
          });
        }
        if (await isListening(pid, o.ctrlSocketPath)) break;
        if (Date.now() > deadline) {
          throw timedOut('SWTPM_START_TIMEOUT', `swtpm did not listen on ${o.ctrlSocketPath} in time.`, {
            details: { log: await tailFile(o.logFile, 20).catch(() => '') },
          });
        }
        await sleep(POLL_MS);
      }
      // The socket's dir is swtpm's: the entry is reached without following a link it put there.
      await chownSocketNoFollow(o.ctrlSocketPath, owner.uid, o.clientIdentity?.gid ?? owner.gid);
      await chmodSocketNoFollow(o.ctrlSocketPath, o.clientIdentity === undefined ? 0o600 : SWTPM_SOCKET_MODE);
      child.unref();
      logger.info({ pid, uid: owner.uid, socket: o.ctrlSocketPath }, 'swtpm listening');
      return handle;
    } finally {
      closeSync(logFd);
    }
  } catch (err) {
    await rollback();
    throw err;
  }
}

/** The handle of a swtpm started earlier (by a daemon before its restart), from its record. */
export function attachSwtpm(record: SwtpmRecordLike): SwtpmProcess {
  return makeHandle(record);
}

function makeHandle(r: SwtpmRecordLike): SwtpmProcess {
  return {
    ...r,
    pids: () => (isSameLiveProcess(r.pid, r.startTimeTicks) ? [r.pid] : []),
    async stop(timeoutMs = DEFAULT_STOP_TIMEOUT_MS): Promise<void> {
      await stopProcess(r.pid, r.startTimeTicks, timeoutMs);
      // swtpm is gone: nothing of its identity can swap these entries any more.
      await fsp.rm(r.ctrlSocketPath, { force: true });
      await fsp.rm(r.stateDir, { recursive: true, force: true });
    },
  };
}

/** SIGTERM (swtpm writes its state and leaves), then SIGKILL after `timeoutMs`; waits until it is gone. */
async function stopProcess(pid: number, startTimeTicks: number, timeoutMs: number): Promise<void> {
  for (const [signal, waitMs] of [
    ['SIGTERM', timeoutMs],
    ['SIGKILL', 5_000],
  ] as const) {
    if (!isSameLiveProcess(pid, startTimeTicks)) return;
    try {
      process.kill(pid, signal);
    } catch {
      return;
    }
    const until = Date.now() + waitMs;
    while (isSameLiveProcess(pid, startTimeTicks) && Date.now() < until) await sleep(POLL_MS);
  }
}

async function spawnDetached(file: string, args: string[], logFd: number, gated: boolean): Promise<ChildProcess> {
  const child = spawn(file, args, { detached: true, stdio: ['ignore', logFd, logFd, ...(gated ? (['pipe'] as const) : [])] });
  child.stdio[START_GATE_FD]?.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (err) => reject(unavailable('SWTPM_SPAWN_FAILED', `swtpm could not be started (${file}).`, { cause: err })));
  });
  return child;
}

/** Let a gated start go on: one byte to the jailer, then our end closed. */
async function openGate(child: ChildProcess): Promise<void> {
  const gate = child.stdio[START_GATE_FD] as Writable | null | undefined;
  if (gate === null || gate === undefined) return;
  await new Promise<void>((resolve, reject) => {
    gate.once('error', reject);
    gate.end(Buffer.from([1]), () => resolve());
  });
}

/**
 * Whether swtpm listens on `socketPath`: read from its own network namespace's table
 * (/proc/<pid>/net/unix; the jailer gives it a namespace of its own), never by connecting (a
 * connection would be a client swtpm serves instead of QEMU).
 */
async function isListening(pid: number, socketPath: string): Promise<boolean> {
  let table: string;
  try {
    table = await fsp.readFile(`/proc/${pid}/net/unix`, 'utf8');
  } catch {
    return false;
  }
  for (const line of table.split('\n')) {
    const fields = line.trim().split(/\s+/);
    if (fields[7] !== socketPath) continue;
    if ((Number.parseInt(fields[3] ?? '0', 16) & UNIX_LISTENING_FLAGS) !== 0) return true;
  }
  return false;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
