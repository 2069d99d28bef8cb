/**
 * VM templates, the execute step (docs/templates.md): build a template (boot, wait for the
 * agent, stop, save the device state beside the RAM file) and start a clone from it (verify,
 * restore, cont). The planners are in template.ts.
 */
import { createHash } from 'node:crypto';
import { createReadStream, constants as fsConstants, promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { errorMessage, precondition, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { reniceProcess } from '../common/procfs.js';
import type { VmSocketPaths } from './argv.js';
import { startVm, type VmProcess, vmPaths } from './launcher.js';
import {
  type CloneShare,
  planCloneArgv,
  planCloneRestore,
  planTemplateArgv,
  planTemplateSave,
  TEMPLATE_RECORD_VERSION,
  type TemplateKey,
  type TemplatePaths,
  type TemplateRecord,
  type TemplateVmSpec,
  templateArgvDigest,
  templatePaths,
  verifyTemplateRecord,
} from './template.js';

/** statfs f_type of tmpfs: the RAM file must be memory, never a disk file paged in and out. */
const TMPFS_MAGIC = 0x01021994;
/** The device state of a small VM is a few hundred KiB; anything near this is not ours. */
export const TEMPLATE_STATE_MAX_BYTES = 64 * 1024 * 1024;
const MIGRATION_POLL_MS = 50;
/** The build VM's last report is already held when its agent answered; this only bounds a guest that never sent one. */
const GUEST_REPORT_WAIT_MS = 10_000;

/** sha256 of a file, streamed. */
export async function fileSha256(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** The key of a template for `spec` as the files are now (hashes the QEMU binary and the guest). */
export async function computeTemplateKey(qemuBinary: string, spec: TemplateVmSpec): Promise<TemplateKey> {
  const qemuPath = await resolveQemuBinary(qemuBinary);
  const [qemuBinarySha256, kernelSha256, initrdSha256, guestImageSha256] = await Promise.all([
    fileSha256(qemuPath),
    fileSha256(spec.kernelPath),
    fileSha256(spec.initrdPath),
    spec.guestImagePath === undefined ? Promise.resolve(null) : fileSha256(spec.guestImagePath),
  ]);
  return { qemuBinarySha256, kernelSha256, initrdSha256, guestImageSha256, argvSha256: templateArgvDigest(spec) };
}

/** The QEMU binary's path: as given when it has a slash, else looked up on PATH. */
export async function resolveQemuBinary(qemuBinary: string): Promise<string> {
  return qemuBinary.includes('/') ? qemuBinary : whichBinary(qemuBinary);
}

/**
 * What identifies the key's input files as they are now without reading them: each file's device,
 * inode, size, and modification and change times in nanoseconds (a file rewritten or replaced
 * changes its ctime or inode; ctime cannot be set back from user space), and the argv digest.
 * Equal fingerprints: computeTemplateKey would answer the same key.
 */
export async function templateInputFingerprint(qemuBinary: string, spec: TemplateVmSpec): Promise<string> {
  const files = [await resolveQemuBinary(qemuBinary), spec.kernelPath, spec.initrdPath, spec.guestImagePath ?? null];
  const ids = await Promise.all(
    files.map(async (f) => {
      if (f === null) return null;
      const st = await fsp.stat(f, { bigint: true });
      return [f, String(st.dev), String(st.ino), String(st.size), String(st.mtimeNs), String(st.ctimeNs)];
    }),
  );
  return JSON.stringify([ids, templateArgvDigest(spec)]);
}

async function whichBinary(name: string): Promise<string> {
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(':')) {
    const candidate = path.join(dir, name);
    try {
      await fsp.access(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // next
    }
  }
  throw precondition('TEMPLATE_RECORD_INVALID', `QEMU binary ${name} is not on PATH; the template key needs its digest.`);
}

export interface BuildTemplateOptions {
  qemuBinary: string;
  spec: TemplateVmSpec;
  /** The key computeTemplateKey gave for `spec`; recorded beside the state. */
  key: TemplateKey;
  /** On a memory file system (tmpfs); created; must not hold a template yet. */
  templateDir: string;
  /** The template VM's sockets and logs (removed by the caller). */
  workDir: string;
  logger: Logger;
  /** Resolves once the agent behind `agentSocket` answers (and has let go of the socket). */
  waitAgentReady: (agentSocket: string, vm: VmProcess) => Promise<void>;
  /** Bound for the migration of the device state; 60 s unless given. */
  migrateTimeoutMs?: number;
  /**
   * The build VM's nice value (every QEMU thread, set before it runs). The runtime gives the pool's
   * (19): no pod waits on a build (a pod that finds no template boots cold), so it yields the CPU.
   */
  nice?: number;
}

/**
 * Boot the template VM, wait for its agent, stop it, save its device state, quit it, and make
 * its RAM file read-only. On any failure the VM is killed and the template directory removed.
 */
export async function buildTemplate(options: BuildTemplateOptions): Promise<TemplateRecord> {
  const started = Date.now();
  const files = templatePaths(options.templateDir);
  try {
    await fsp.mkdir(files.dir, { recursive: false, mode: 0o700 });
  } catch (err) {
    // Never built over: an existing directory may be a template clones are using.
    throw precondition('TEMPLATE_DIR_UNUSABLE', `templateDir ${files.dir} cannot be created: ${errorMessage(err)}.`, { cause: err });
  }
  let vm: VmProcess | undefined;
  try {
    const fs = await fsp.statfs(files.dir);
    if (fs.type !== TMPFS_MAGIC) {
      throw precondition('TEMPLATE_RAM_NOT_ON_TMPFS', `templateDir ${files.dir} is not on tmpfs: the shared RAM file must be memory.`);
    }
    const paths = socketPaths(options.workDir);
    const argv = planTemplateArgv(options.spec, 'kata-ts-template', paths, files.ramFile);
    vm = await startVm({ qemuBinary: options.qemuBinary, argv, workDir: options.workDir, logger: options.logger });
    if (options.nice !== undefined) reniceProcess(vm.pid, options.nice);
    await vm.resume();
    await options.waitAgentReady(paths.agentSocket!, vm);
    const { sha256, bytes } = await saveDeviceState(vm, options.workDir, files, options.migrateTimeoutMs ?? 60_000);
    // Stopped: the guest sends nothing more. Its ready report came before its agent answered.
    const report = await vm.waitForGuestReport(() => true, GUEST_REPORT_WAIT_MS);
    await vm.kill();
    vm = undefined;
    const ram = await fsp.stat(files.ramFile);
    // Nothing writes the template's RAM again: clones map it private.
    await fsp.chmod(files.ramFile, 0o444);
    await fsp.chmod(files.stateFile, 0o444);
    const record: TemplateRecord = {
      version: TEMPLATE_RECORD_VERSION,
      key: options.key,
      stateSha256: sha256,
      stateBytes: bytes,
      ramBytes: ram.size,
      guest: { vcpus: report.vcpus, memoryKiB: report.memoryKiB, onlineMemoryKiB: report.onlineMemoryKiB },
      builtAt: new Date().toISOString(),
      buildMs: Date.now() - started,
    };
    const tmp = `${files.recordFile}.tmp`;
    await fsp.writeFile(tmp, `${JSON.stringify(record, null, 2)}\n`, { mode: 0o444, flag: 'wx' });
    await fsp.rename(tmp, files.recordFile);
    return record;
  } catch (err) {
    if (vm !== undefined) await vm.kill().catch(() => undefined);
    await fsp.rm(files.dir, { recursive: true, force: true });
    throw err;
  }
}

/** The unix socket the migration stream crosses (QEMU connects on save, listens on restore). */
function migrationSocket(workDir: string): string {
  return path.join(workDir, 'migrate.sock');
}

function socketPaths(workDir: string): VmSocketPaths {
  return { ...vmPaths(workDir), agentSocket: path.join(workDir, 'agent.sock') };
}

/** Stop the VM and stream its device state (x-ignore-shared: not its RAM) into the state file. */
async function saveDeviceState(
  vm: VmProcess,
  workDir: string,
  files: TemplatePaths,
  timeoutMs: number,
): Promise<{ sha256: string; bytes: number }> {
  const sock = migrationSocket(workDir);
  await fsp.rm(sock, { force: true });
  const out = await fsp.open(files.stateFile, 'wx', 0o600);
  const hash = createHash('sha256');
  let bytes = 0;
  let tooLarge = false;
  const server = net.createServer();
  const received = new Promise<void>((resolve, reject) => {
    server.once('connection', (conn) => {
      server.close();
      conn.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        if (bytes > TEMPLATE_STATE_MAX_BYTES) {
          tooLarge = true;
          conn.destroy();
          return;
        }
        hash.update(chunk);
        conn.pause();
        out.write(chunk).then(
          () => conn.resume(),
          (err: unknown) => {
            conn.destroy();
            reject(err);
          },
        );
      });
      conn.once('end', () => resolve());
      conn.once('error', reject);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(sock, () => resolve());
  });
  try {
    for (const step of planTemplateSave(`unix:${sock}`)) await vm.qmp.execute(step.command, step.arguments);
    await waitMigration(vm, timeoutMs, 'save');
    await withTimeout(received, timeoutMs, 'the device state stream did not end');
    if (tooLarge) throw precondition('TEMPLATE_STATE_CORRUPT', `the device state exceeded ${TEMPLATE_STATE_MAX_BYTES} bytes.`);
    await out.sync();
    return { sha256: hash.digest('hex'), bytes };
  } finally {
    server.close();
    await out.close();
    await fsp.rm(sock, { force: true });
  }
}

/** Poll query-migrate until completed; a failed or cancelled migration throws with QEMU's reason. */
async function waitMigration(vm: VmProcess, timeoutMs: number, what: 'save' | 'restore'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const info = await vm.qmp.execute<{ status?: string; 'error-desc'?: string }>('query-migrate');
    if (info.status === 'completed') return;
    if (info.status === 'failed' || info.status === 'cancelled') {
      throw unavailable('TEMPLATE_MIGRATION_FAILED', `the template's ${what} failed in QEMU: ${info['error-desc'] ?? info.status}.`);
    }
    if (vm.exitInfo !== undefined) throw unavailable('TEMPLATE_MIGRATION_FAILED', `QEMU exited during the template's ${what}.`);
    if (Date.now() > deadline) throw timedOut('TEMPLATE_MIGRATION_FAILED', `the template's ${what} did not complete in ${timeoutMs} ms.`);
    await new Promise((r) => setTimeout(r, MIGRATION_POLL_MS));
  }
}

async function withTimeout<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(timedOut('TEMPLATE_MIGRATION_FAILED', `${what} in ${timeoutMs} ms.`)), timeoutMs);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Read a template's record and state and check them against `wanted`: the key, the state's
 * checksum and size, the RAM file's size and mode. Returns the verified state bytes, which are
 * the ones a clone is fed (never read again from the file).
 */
export async function loadVerifiedTemplate(templateDir: string, wanted: TemplateKey): Promise<{ record: TemplateRecord; state: Buffer }> {
  const files = templatePaths(templateDir);
  let raw: string;
  try {
    raw = await fsp.readFile(files.recordFile, { encoding: 'utf8', flag: fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW });
  } catch (err) {
    throw precondition('TEMPLATE_RECORD_INVALID', `template record ${files.recordFile} cannot be read: ${errorMessage(err)}.`, {
      cause: err,
    });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch (err) {
    throw precondition('TEMPLATE_RECORD_INVALID', `template record ${files.recordFile} is not JSON.`, { cause: err });
  }
  const record = verifyTemplateRecord(parsed, wanted);
  const ram = await fsp.lstat(files.ramFile).catch(() => undefined);
  if (ram === undefined || !ram.isFile() || ram.size !== record.ramBytes || (ram.mode & 0o222) !== 0) {
    throw precondition(
      'TEMPLATE_RAM_FILE_INVALID',
      `template RAM file ${files.ramFile} is missing, resized or writable; rebuild the template.`,
    );
  }
  const st = await fsp.lstat(files.stateFile).catch(() => undefined);
  if (st === undefined || !st.isFile() || st.size !== record.stateBytes) {
    throw precondition('TEMPLATE_STATE_CORRUPT', `template state file ${files.stateFile} is missing or not ${record.stateBytes} bytes.`);
  }
  const state = await fsp.readFile(files.stateFile, { flag: fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW });
  const sha = createHash('sha256').update(state).digest('hex');
  if (sha !== record.stateSha256) {
    throw precondition(
      'TEMPLATE_STATE_CORRUPT',
      `template state file ${files.stateFile} does not match its recorded sha256; rebuild the template.`,
    );
  }
  return { record, state };
}

export interface StartCloneOptions {
  qemuBinary: string;
  spec: TemplateVmSpec;
  /** The key computed now for `spec`: a template built from another is refused. */
  key: TemplateKey;
  templateDir: string;
  /** The clone's own sockets and logs. */
  workDir: string;
  /** `-name guest=`. */
  name: string;
  logger: Logger;
  /** The pod's shared directory over 9p (its fsdev on the command line; the device is hot-plugged). */
  share?: CloneShare;
  /**
   * The pod's network namespace, which the clone's QEMU runs in (as a cold boot's does): QEMU
   * opens a hot-plugged NIC's TAP by name in its own namespace. Absent: the daemon's.
   */
  netnsPath?: string;
  /**
   * Puts the clone's QEMU in its cgroup while it is still stopped (before the restore), as a cold
   * boot's is: no guest instruction runs outside the pod's budget. A failure ends the clone.
   */
  place?: (pid: number) => Promise<void>;
  /** QMP's own answer bound (HypervisorConfig.qmpTimeoutMs). */
  qmpTimeoutMs?: number;
  migrateTimeoutMs?: number;
}

/**
 * Verify the template, start a clone paused with `-incoming defer`, feed it the verified device
 * state, and `cont`. The guest runs on from where the template stopped: its agent answers on the
 * clone's agent socket without a boot. On failure the clone is killed. Returns the VM and the
 * time the restore took.
 */
export async function startClone(options: StartCloneOptions): Promise<{ vm: VmProcess; agentSocket: string; restoreMs: number }> {
  const started = Date.now();
  const { state } = await loadVerifiedTemplate(options.templateDir, options.key);
  const files = templatePaths(options.templateDir);
  const paths = socketPaths(options.workDir);
  const argv = planCloneArgv(options.spec, options.name, paths, files.ramFile, options.share);
  const vm = await startVm({
    qemuBinary: options.qemuBinary,
    argv,
    workDir: options.workDir,
    logger: options.logger,
    ...(options.netnsPath === undefined ? {} : { netnsPath: options.netnsPath }),
    ...(options.place === undefined ? {} : { place: options.place }),
    ...(options.qmpTimeoutMs === undefined ? {} : { qmpTimeoutMs: options.qmpTimeoutMs }),
  });
  const timeoutMs = options.migrateTimeoutMs ?? 60_000;
  try {
    const sock = migrationSocket(options.workDir);
    await fsp.rm(sock, { force: true });
    for (const step of planCloneRestore(`unix:${sock}`)) await vm.qmp.execute(step.command, step.arguments);
    await withTimeout(sendState(sock, state), timeoutMs, 'the clone did not take its device state');
    await waitMigration(vm, timeoutMs, 'restore');
    await vm.resume();
    return { vm, agentSocket: paths.agentSocket!, restoreMs: Date.now() - started };
  } catch (err) {
    await vm.kill().catch(() => undefined);
    throw err;
  }
}

/** Connect to the socket QEMU listens on for migrate-incoming and write the state. */
async function sendState(sock: string, state: Buffer): Promise<void> {
  // QEMU creates the listening socket inside migrate-incoming, which has returned by now.
  const conn = net.createConnection(sock);
  await new Promise<void>((resolve, reject) => {
    conn.once('error', reject);
    conn.once('connect', () => resolve());
  });
  await new Promise<void>((resolve, reject) => {
    conn.once('error', reject);
    conn.end(state, () => resolve());
  });
}
