/**
 * A real swtpm started through startSwtpm, as a pod's would be: the node's EK CA made by
 * initTpmCa in a temporary root, two identities leased from the node's VMM range (swtpm's own and
 * a stand-in for QEMU's), swtpm's jail built by the sandbox's buildJail from swtpmJailSpec. Then
 * proved by attack: QEMU's identity reaches the control socket but not the state, another
 * identity reaches neither; the EK certificate in the TPM's NV is the one returned and verifies
 * against the CA bundle `kata-ts tpm-ca show` prints; stop leaves nothing. Everything made is
 * removed, pass or fail; only processes this file started are ever signalled.
 */
import { execFile, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { isSameLiveProcess, readCmdline, readProcStat } from '../../../src/common/procfs.js';
import { DEFAULT_VMM_FIRST_ID, DEFAULT_VMM_ID_COUNT, DEFAULT_VMM_LEASE_DIR } from '../../../src/config/defaults.js';
import { connectQmp, defaultJailerBinary, type VmmIdentity } from '../../../src/hypervisor/index.js';
import { type LeaseOwner, VmmIdentities } from '../../../src/runtime/sandbox/identities.js';
import { buildJail, releaseJail } from '../../../src/runtime/sandbox/jail.js';
import { initTpmCa, readTpmCa, rotateTpmCa } from '../../../src/tpm/ca.js';
import {
  attachSwtpm,
  SWTPM_MIGRATION_KEY_FILE,
  SWTPM_STATE_FILE,
  type SwtpmProcess,
  startSwtpm,
  swtpmJailSpec,
} from '../../../src/tpm/swtpm.js';
import { rejection } from '../../helpers/kata-error.js';
import { until } from '../../helpers/poll.js';

const SWTPM = '/usr/bin/swtpm';
const QEMU = '/usr/bin/qemu-system-x86_64';
const NEEDED = [
  SWTPM,
  QEMU,
  '/usr/bin/swtpm_setup',
  '/usr/bin/swtpm_ioctl',
  '/usr/bin/tpm2_nvread',
  '/usr/bin/openssl',
  '/usr/bin/setpriv',
];
const missing = [...NEEDED, defaultJailerBinary()].filter((p) => !existsSync(p));
const isRoot = process.getuid?.() === 0;

function run(file: string, args: string[], timeoutMs = 60_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: timeoutMs, encoding: 'utf8' }, (err, stdout, stderr) => {
      const code =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code as number) : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

/** `args` run as `id` with no supplementary groups (as a confined QEMU would be). */
function runAs(id: VmmIdentity, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return run('/usr/bin/setpriv', [`--reuid=${id.uid}`, `--regid=${id.gid}`, '--clear-groups', '--', ...args]);
}

function statusField(pid: number, name: string): string {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${name}:`));
  return (line ?? '').slice(name.length + 1).trim();
}

describe.skipIf(missing.length > 0 || !isRoot)('a pod swtpm through startSwtpm (real swtpm, jail, identities)', () => {
  let root: string;
  let identities: VmmIdentities;
  const leases: Array<{ id: number; owner: LeaseOwner }> = [];
  let own: VmmIdentity;
  let qemu: VmmIdentity;
  let swtpm: SwtpmProcess | undefined;
  let jailDir: string;
  let workDir: string;
  let stateDir: string;
  let socketPath: string;
  let placedWhile: string[] = [];
  const started: number[] = [];

  /** The dirs as the sandbox makes them (src/runtime/sandbox/tpm.ts; startSwtpm takes them over), the jail, then swtpm. */
  async function startConfined(): Promise<SwtpmProcess> {
    await fsp.mkdir(stateDir, { mode: 0o700 });
    await fsp.mkdir(path.dirname(socketPath), { recursive: true, mode: 0o750 });
    await buildJail(swtpmJailSpec({ jailDir, stateDir, ctrlSocketPath: socketPath }), own);
    return startSwtpm({
      stateDir,
      ctrlSocketPath: socketPath,
      logFile: path.join(workDir, 'swtpm.log'),
      caDir: path.join(root, 'ca'),
      identity: own,
      clientIdentity: qemu,
      jail: { jailDir },
      place: async (pid) => {
        started.push(pid);
        // What runs while it is placed: still the jailer (its gate held), not swtpm.
        placedWhile = readCmdline(pid);
      },
      logger: silentLogger(),
    });
  }

  beforeAll(async () => {
    root = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-swtpm-'));
    // QEMU's identity must traverse to the socket's dir, as it would through a pod's work dir.
    await fsp.chmod(root, 0o755);
    identities = new VmmIdentities(
      { firstId: DEFAULT_VMM_FIRST_ID, count: DEFAULT_VMM_ID_COUNT, leaseDir: DEFAULT_VMM_LEASE_DIR, quarantineMs: 0 },
      silentLogger(),
    );
    for (const name of ['swtpm', 'qemu']) {
      // A lease is held while its record file exists (identities.ts): one per holder, in the test's root.
      const owner = { sandboxId: `swtpm-test-${name}`, recordFile: path.join(root, `${name}.record.json`) };
      await fsp.writeFile(owner.recordFile, '{}\n');
      const id = await identities.acquire(owner);
      leases.push({ id: id.uid, owner });
      if (name === 'swtpm') own = id;
      else qemu = id;
    }
    workDir = path.join(root, 'pod');
    await fsp.mkdir(workDir, { mode: 0o755 });
    stateDir = path.join(workDir, 'tpm');
    socketPath = path.join(workDir, 'tpm-sock', 'ctrl.sock');
    jailDir = path.join(workDir, 'tpm-jail');
    await initTpmCa(path.join(root, 'ca'));
  }, 120_000);

  afterAll(async () => {
    await swtpm?.stop().catch(() => undefined);
    for (const pid of started) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    if (jailDir !== undefined) await releaseJail(jailDir, silentLogger()).catch(() => undefined);
    for (const lease of leases) await identities.release(lease.id, lease.owner).catch(() => undefined);
    if (root !== undefined) await fsp.rm(root, { recursive: true, force: true });
  }, 60_000);

  it('starts swtpm as its own identity in its jail, placed before it runs, socket for QEMU only, EK cert from the CA', async () => {
    swtpm = await startConfined();
    const pid = swtpm.pid;
    expect(path.basename(placedWhile[0] ?? '')).toBe('kata-ts-jailer');
    expect(readCmdline(pid).slice(0, 2)).toEqual([SWTPM, 'socket']);
    expect(swtpm.pids()).toEqual([pid]);
    // Its own identity, nothing else: no groups, no capabilities, no_new_privs, seccomp filter on.
    expect(statusField(pid, 'Uid').split(/\s+/)).toEqual(Array(4).fill(String(own.uid)));
    expect(statusField(pid, 'Gid').split(/\s+/)).toEqual(Array(4).fill(String(own.gid)));
    expect(statusField(pid, 'Groups')).toBe('');
    for (const caps of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']) expect(statusField(pid, caps), caps).toBe('0000000000000000');
    expect(statusField(pid, 'NoNewPrivs')).toBe('1');
    expect(statusField(pid, 'Seccomp')).toBe('2');
    // Its own mount (the jail) and network namespaces.
    for (const ns of ['mnt', 'net', 'ipc'])
      expect(await fsp.readlink(`/proc/${pid}/ns/${ns}`), ns).not.toBe(await fsp.readlink(`/proc/self/ns/${ns}`));
    const sock = await fsp.lstat(socketPath);
    expect(sock.isSocket()).toBe(true);
    expect([sock.uid, sock.gid, sock.mode & 0o777]).toEqual([own.uid, qemu.gid, 0o660]);
    const state = await fsp.lstat(stateDir);
    expect([state.uid, state.gid, state.mode & 0o777]).toEqual([own.uid, own.gid, 0o700]);
    const stateFile = await fsp.lstat(path.join(stateDir, SWTPM_STATE_FILE));
    expect([stateFile.uid, stateFile.mode & 0o777]).toEqual([own.uid, 0o600]);
    // The CA's key is nowhere in the pod's dir (nor, so, in the jail).
    // (Not a recursive walk of the work dir: the jail in it binds /usr.)
    const podFiles = [
      ...(await fsp.readdir(workDir)),
      ...(await fsp.readdir(stateDir)),
      ...(await fsp.readdir(path.dirname(socketPath))),
      ...(await fsp.readdir(jailDir)),
    ];
    expect(podFiles).toContain(SWTPM_STATE_FILE);
    // swtpm read its migration key and deleted it: it is nowhere on disk.
    expect(podFiles).not.toContain(SWTPM_MIGRATION_KEY_FILE);
    expect(podFiles.filter((f) => f.includes('signkey') || f.includes('swtpm-setup'))).toEqual([]);
  }, 180_000);

  it("the EK certificate verifies against the CA bundle (openssl verify) and is the one in the TPM's NV", async () => {
    const ca = await readTpmCa(path.join(root, 'ca'));
    await fsp.writeFile(path.join(root, 'bundle.pem'), ca.bundlePem);
    await fsp.writeFile(path.join(root, 'ek.pem'), swtpm!.ekCertPem);
    const verified = await run('openssl', ['verify', '-CAfile', path.join(root, 'bundle.pem'), path.join(root, 'ek.pem')]);
    expect(verified.stdout + verified.stderr).toContain(': OK');
    expect(verified.code).toBe(0);
    // A CA that is not the node's does not verify it.
    const other = await initTpmCa(path.join(root, 'other-ca'));
    await fsp.writeFile(path.join(root, 'other.pem'), other.ca.bundlePem);
    const refused = await run('openssl', ['verify', '-CAfile', path.join(root, 'other.pem'), path.join(root, 'ek.pem')]);
    expect(refused.code).not.toBe(0);

    // The TPM itself: a copy of its state served by a second swtpm on loopback, read with tpm2_nvread.
    const copyDir = path.join(root, 'state-copy');
    await fsp.mkdir(copyDir, { mode: 0o700 });
    await fsp.copyFile(path.join(stateDir, SWTPM_STATE_FILE), path.join(copyDir, SWTPM_STATE_FILE));
    const port = 20000 + Math.floor(Math.random() * 20000) * 2;
    const server = spawn(
      SWTPM,
      [
        'socket',
        '--tpm2',
        '--tpmstate',
        `dir=${copyDir}`,
        '--server',
        `type=tcp,port=${port},bindaddr=127.0.0.1`,
        '--ctrl',
        `type=tcp,port=${port + 1},bindaddr=127.0.0.1`,
        '--flags',
        'startup-clear',
      ],
      { stdio: 'ignore' },
    );
    started.push(server.pid!);
    try {
      await until(
        'the copy swtpm listening on loopback',
        () =>
          new Promise<true | undefined>((resolve) => {
            const s = net.connect(port, '127.0.0.1', () => {
              s.destroy();
              resolve(true);
            });
            s.once('error', () => resolve(undefined));
          }),
        30_000,
        50,
      );
      const out = path.join(root, 'ek-nv.der');
      const nv = await run('tpm2_nvread', ['-T', `swtpm:host=127.0.0.1,port=${port}`, '-C', 'o', '-o', out, '0x1c00002']);
      expect(nv.code, nv.stderr).toBe(0);
      const fromNv = new X509Certificate(await fsp.readFile(out));
      expect(fromNv.toString()).toBe(new X509Certificate(swtpm!.ekCertPem).toString());
    } finally {
      server.kill('SIGKILL');
    }
  }, 120_000);

  it("QEMU's identity reaches the control socket but cannot read or write the TPM's state", async () => {
    const caps = await runAs(qemu, ['swtpm_ioctl', '--unix', socketPath, '-c']);
    expect(caps.code, caps.stderr).toBe(0);
    expect(caps.stdout).toMatch(/ptm capability/i);
    const read = await runAs(qemu, ['cat', path.join(stateDir, SWTPM_STATE_FILE)]);
    expect(read.code).not.toBe(0);
    expect(read.stderr).toMatch(/Permission denied/);
    const write = await runAs(qemu, ['touch', path.join(stateDir, 'forged')]);
    expect(write.code).not.toBe(0);
    expect(existsSync(path.join(stateDir, 'forged'))).toBe(false);
    // Nor through the control channel: state blobs come out encrypted with this pod's migration
    // key (the EK certificate, plain in the state file, is not in the blob), and a plain state
    // (here the TPM's own, as a QEMU would forge one) is refused by a stopped TPM.
    const qemuDir = path.join(root, 'qemu-files');
    await fsp.mkdir(qemuDir, { mode: 0o700 });
    await fsp.chown(qemuDir, qemu.uid, qemu.gid);
    const stateBefore = await fsp.readFile(path.join(stateDir, SWTPM_STATE_FILE));
    const ekDer = new X509Certificate(swtpm!.ekCertPem).raw;
    expect(stateBefore.indexOf(ekDer)).toBeGreaterThanOrEqual(0);
    // CMD_INIT first, as QEMU sends it: the TPM must be running to hand out its state.
    const init = await runAs(qemu, ['swtpm_ioctl', '--unix', socketPath, '-i']);
    expect(init.code, init.stderr).toBe(0);
    const saved = await runAs(qemu, ['swtpm_ioctl', '--unix', socketPath, '--save', 'permanent', path.join(qemuDir, 'saved.blob')]);
    expect(saved.code, saved.stderr).toBe(0);
    const blob = await fsp.readFile(path.join(qemuDir, 'saved.blob'));
    expect(blob.length).toBeGreaterThan(0);
    expect(blob.indexOf(ekDer)).toBe(-1);
    await fsp.writeFile(path.join(qemuDir, 'plain.blob'), stateBefore);
    await fsp.chown(path.join(qemuDir, 'plain.blob'), qemu.uid, qemu.gid);
    expect((await runAs(qemu, ['swtpm_ioctl', '--unix', socketPath, '--stop'])).code).toBe(0);
    const load = await runAs(qemu, ['swtpm_ioctl', '--unix', socketPath, '--load', 'permanent', path.join(qemuDir, 'plain.blob')]);
    expect(load.code).not.toBe(0);
    expect((await fsp.readFile(path.join(stateDir, SWTPM_STATE_FILE))).equals(stateBefore)).toBe(true);
    // Nor replace the socket QEMU connects to: the dir is swtpm's, QEMU's group may only enter it.
    const swap = await runAs(qemu, ['rm', '-f', socketPath]);
    expect(swap.code).not.toBe(0);
    expect((await fsp.lstat(socketPath)).isSocket()).toBe(true);
  }, 60_000);

  it('another identity cannot connect to the control socket', async () => {
    const nobody = { uid: 65534, gid: 65534 };
    const denied = await runAs(nobody, ['swtpm_ioctl', '--unix', socketPath, '-c']);
    expect(denied.code).not.toBe(0);
    // swtpm's own identity has no reason to connect either, but QEMU's gid is the only group let in.
    expect((await fsp.lstat(path.dirname(socketPath))).mode & 0o007).toBe(0);
  }, 60_000);

  it('a handle re-attached from the record (a daemon restart) stops it: no process, socket or state is left', async () => {
    const first = swtpm!;
    const attached = attachSwtpm({
      pid: first.pid,
      startTimeTicks: first.startTimeTicks,
      ctrlSocketPath: first.ctrlSocketPath,
      stateDir,
      ekCertPem: first.ekCertPem,
    });
    expect(attached.pids()).toEqual([first.pid]);
    await attached.stop();
    swtpm = undefined;
    expect(existsSync(`/proc/${first.pid}`)).toBe(false);
    expect(attached.pids()).toEqual([]);
    expect(existsSync(socketPath)).toBe(false);
    expect(existsSync(stateDir)).toBe(false);
  }, 60_000);

  it("QEMU as its identity realises tpm-crb on a new jailed swtpm's socket; swtpm leaves when that QEMU does; stop, the jail and the leases leave nothing", async () => {
    // A new pod's TPM in the same place: the old jail (bound to the removed state dir) goes first.
    await releaseJail(jailDir, silentLogger());
    await fsp.rm(jailDir, { recursive: true });
    swtpm = await startConfined();
    // Paused (-S), no firmware run: QEMU still opens the emulator (capabilities, the data channel, its buffer size) at start.
    const qemuDir = path.join(root, 'qemu-run');
    await fsp.mkdir(qemuDir, { mode: 0o700 });
    await fsp.chown(qemuDir, qemu.uid, qemu.gid);
    const qmpSocket = path.join(qemuDir, 'qmp.sock');
    const vm = spawn(
      '/usr/bin/setpriv',
      [
        `--reuid=${qemu.uid}`,
        `--regid=${qemu.gid}`,
        '--clear-groups',
        '--',
        QEMU,
        ...['-M', 'q35', '-accel', 'tcg', '-nodefaults', '-display', 'none', '-S', '-m', '128'],
        ...[
          '-chardev',
          `socket,id=chrtpm,path=${socketPath}`,
          '-tpmdev',
          'emulator,id=tpm0,chardev=chrtpm',
          '-device',
          'tpm-crb,tpmdev=tpm0',
        ],
        ...['-qmp', `unix:${qmpSocket},server=on,wait=off`],
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    started.push(vm.pid!);
    let vmErr = '';
    vm.stderr!.on('data', (d: Buffer) => {
      vmErr += d.toString();
    });
    const qmp = await until(
      "QEMU's QMP socket",
      async (note) => {
        note(vmErr || `exit ${vm.exitCode}`);
        if (vm.exitCode !== null) throw new Error(`QEMU exited: ${vmErr}`);
        return existsSync(qmpSocket) ? connectQmp(qmpSocket, { logger: silentLogger() }).catch(() => undefined) : undefined;
      },
      60_000,
      50,
    );
    try {
      const tpms = await qmp.execute<Array<{ id: string; model: string; options: { type: string } }>>('query-tpm');
      expect(tpms.map((t) => [t.id, t.model, t.options.type])).toEqual([['tpm0', 'tpm-crb', 'emulator']]);
    } finally {
      qmp.close();
    }
    vm.kill('SIGKILL');
    await until('QEMU gone', async () => (vm.exitCode !== null || vm.signalCode !== null ? true : undefined), 30_000, 20);
    // --terminate: its data channel closed with QEMU, swtpm writes its state and leaves by itself.
    const pid = swtpm!.pid;
    await until(
      'swtpm to leave after its QEMU',
      async (note) => {
        note(existsSync(`/proc/${pid}`) ? readCmdline(pid).join(' ') : 'gone');
        return swtpm!.pids().length === 0 ? true : undefined;
      },
      30_000,
      50,
    );
    expect(vmErr).not.toMatch(/tpm/i);
    await swtpm!.stop();
    swtpm = undefined;
    expect(existsSync(socketPath)).toBe(false);
    expect(existsSync(stateDir)).toBe(false);
    await releaseJail(jailDir, silentLogger());
    for (const lease of leases.splice(0)) {
      await identities.release(lease.id, lease.owner);
      const text = await fsp.readFile(identities.leaseFile(lease.id), 'utf8').catch(() => '');
      expect(text).not.toContain(lease.owner.sandboxId);
    }
    // Nothing of either identity runs any more.
    const residue = await identities.residue();
    expect(residue.get(own.uid) ?? []).toEqual([]);
    expect(residue.get(qemu.uid) ?? []).toEqual([]);
  }, 120_000);

  it('after a rotation a new TPM (here unconfined, as root) gets its EK certificate from the new CA; the old one still verifies against the bundle until the next rotation', async () => {
    const caDir = path.join(root, 'ca');
    const before = await readTpmCa(caDir);
    const rotated = await rotateTpmCa(caDir);
    expect(rotated.ca.current.generation).toBe(before.current.generation + 1);
    expect(rotated.ca.previous?.generation).toBe(before.current.generation);
    await fsp.writeFile(path.join(root, 'bundle2.pem'), rotated.ca.bundlePem);
    const old = await run('openssl', ['verify', '-CAfile', path.join(root, 'bundle2.pem'), path.join(root, 'ek.pem')]);
    expect(old.code, old.stderr).toBe(0);
    await fsp.mkdir(path.join(root, 'pod2'), { mode: 0o755 });
    const second = await startSwtpm({
      stateDir: path.join(root, 'pod2', 'tpm'),
      ctrlSocketPath: path.join(root, 'pod2', 'sock', 'ctrl.sock'),
      logFile: path.join(root, 'pod2-swtpm.log'),
      caDir,
      logger: silentLogger(),
    });
    swtpm = second;
    const ek = new X509Certificate(second.ekCertPem);
    expect(ek.checkIssued(new X509Certificate(rotated.ca.current.certPem))).toBe(true);
    expect(ek.checkIssued(new X509Certificate(before.current.certPem))).toBe(false);
    expect(statusField(second.pid, 'Uid').split(/\s+/)[0]).toBe('0');
    await second.stop();
    swtpm = undefined;
    expect(existsSync(path.join(root, 'pod2', 'tpm'))).toBe(false);
    // A second rotation drops the generation that signed ek.pem.
    const again = await rotateTpmCa(caDir);
    expect(again.dropped).toBe(before.current.generation);
    await fsp.writeFile(path.join(root, 'bundle3.pem'), again.ca.bundlePem);
    const dropped = await run('openssl', ['verify', '-CAfile', path.join(root, 'bundle3.pem'), path.join(root, 'ek.pem')]);
    expect(dropped.code).not.toBe(0);
    expect(existsSync(path.join(caDir, `gen-${before.current.generation}`))).toBe(false);
  }, 60_000);
  it('a failed start leaves nothing it made: swtpm_setup failing, placement failing (the process it started is ended)', async () => {
    const caDir = path.join(root, 'ca');
    const pod = path.join(root, 'pod-fail');
    await fsp.mkdir(pod, { mode: 0o755 });
    const options = {
      stateDir: path.join(pod, 'tpm'),
      ctrlSocketPath: path.join(pod, 'sock', 'ctrl.sock'),
      logFile: path.join(pod, 'swtpm.log'),
      caDir,
      logger: silentLogger(),
    };
    const setupFailed = await rejection(startSwtpm({ ...options, setupBinary: '/usr/bin/false' }));
    expect(setupFailed.reason).toBe('SWTPM_SETUP_FAILED');
    expect(await fsp.readdir(pod)).toEqual([]);

    let placed: { pid: number; start: number } | undefined;
    const placeFailed = await rejection(
      startSwtpm({
        ...options,
        place: async (pid) => {
          started.push(pid);
          placed = { pid, start: readProcStat(pid)?.startTimeTicks ?? 0 };
          throw new Error('cgroup refused the process');
        },
      }),
    );
    expect(placeFailed.reason).toBe('SWTPM_PLACE_FAILED');
    expect(placed).toBeDefined();
    expect(isSameLiveProcess(placed!.pid, placed!.start)).toBe(false);
    // The log stays (it says what happened); nothing else does.
    expect(await fsp.readdir(pod)).toEqual(['swtpm.log']);
  }, 60_000);
});
