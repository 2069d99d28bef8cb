/**
 * The shim binary's process model without containerd: `start` for a sandbox bundle spawns a real,
 * detached `serve` (the TypeScript sources through bin/containerd-shim-kata-ts-v2 with
 * KATA_TS_SHIM_TSX=1, no services registered) that answers on the pod's socket; a container's
 * `start` finds it; SIGTERM ends it; `delete` cleans the pod, and for an unknown id still prints
 * a DeleteResponse and exits 0. `serve` runs in the runtime's mount namespace (bound in the test's
 * temp dir), this process does not. Every process started here is ended by pid in afterAll, and the
 * namespace is removed.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { boundNamespace, namespaceOf, removeMountNamespace } from '../../../src/runtime/mount-namespace.js';
import { decodeDeleteResponse, EXIT_STATUS_KILLED } from '../../../src/shim/delete-response.js';
import { main } from '../../../src/shim/main.js';
import { podStateDir, readShimInfo, shimSocketPath } from '../../../src/shim/paths.js';
import { decodeMessage, encodeMessage } from '../../../src/shim/proto.js';
import { connectTtrpc } from '../../../src/ttrpc/index.js';
import { until } from '../../helpers/poll.js';
import { scaledMs } from '../../helpers/time-scale.js';

const BIN = path.join(packageRoot(), 'bin', 'containerd-shim-kata-ts-v2');
const ADDRESS = '/run/containerd/containerd.sock';
const SANDBOX = 'a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90';
const CONTAINER = 'c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00';
const LONG = scaledMs(90_000);

let root: string;
let nsFile: string;
let env: NodeJS.ProcessEnv;
const servePids = new Set<number>();

beforeAll(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-prog-'));
  const config = path.join(root, 'config.json');
  nsFile = path.join(root, 'mntns', 'mnt');
  writeFileSync(
    config,
    JSON.stringify({ shim: { stateRoot: path.join(root, 'state') }, network: { mode: 'none' }, mountNamespacePath: nsFile }),
  );
  env = { ...process.env, KATA_TS_CONFIG: config, KATA_TS_SHIM_TSX: '1', TTRPC_ADDRESS: `${ADDRESS}.ttrpc` };
});

afterAll(async () => {
  for (const pid of servePids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  await until('the runtime mount namespace to be removed', async (note) => {
    const removal = await removeMountNamespace(nsFile);
    note(removal);
    return removal.users.length === 0 ? true : undefined;
  });
  rmSync(root, { recursive: true, force: true });
});

function bundle(name: string, annotations: Record<string, string>): string {
  const dir = path.join(root, 'bundles', name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    path.join(dir, 'config.json'),
    JSON.stringify({ ociVersion: '1.0.2', annotations, linux: { cgroupsPath: `/kubepods/pod1/${name}` } }),
  );
  return dir;
}

function sink(): { stream: Writable; bytes: () => Buffer } {
  const chunks: Buffer[] = [];
  const stream = new Writable({
    write(chunk: Buffer | string, _enc, done) {
      chunks.push(Buffer.from(chunk));
      done();
    },
  });
  return { stream, bytes: () => Buffer.concat(chunks) };
}

/** `start` in this process (its `serve` child is a real process). */
async function startInProcess(id: string, cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = sink();
  const err = sink();
  const argv = ['-namespace', 'default', '-address', ADDRESS, '-publish-binary', '/usr/bin/containerd', '-id', id, 'start'];
  const code = await main(argv, {
    io: { stdout: out.stream, stderr: err.stream, stdin: Readable.from([Buffer.from([0x0a, 0x00])]) },
    env,
    cwd,
    self: { command: process.execPath, args: [BIN] },
  });
  return { code, stdout: out.bytes().toString(), stderr: err.bytes().toString() };
}

/** The binary as containerd runs it: a child with its own stdin, stdout and stderr. */
function runBinary(args: string[], cwd: string): Promise<{ code: number; stdout: Buffer; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [BIN, ...args], { cwd, env, encoding: 'buffer', timeout: LONG }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === 'number' ? err.code : -1;
      resolve({ code, stdout, stderr: stderr.toString() });
    });
  });
}

/** Field 6 of /proc/<pid>/stat: the session id. */
function sessionOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[3]);
}

describe('containerd-shim-kata-ts-v2', () => {
  const stateDir = () => podStateDir(path.join(root, 'state'), 'default', SANDBOX);
  const socket = () => shimSocketPath(path.join(root, 'state'), ADDRESS, 'default', SANDBOX);

  it(
    'start for a sandbox spawns a detached serve, writes <bundle>/address and prints only that address',
    async () => {
      const dir = bundle('sandbox', { 'io.kubernetes.cri.container-type': 'sandbox', 'io.kubernetes.cri.sandbox-id': SANDBOX });
      const started = await startInProcess(SANDBOX, dir);
      expect(started).toEqual({ code: 0, stdout: `unix://${socket()}`, stderr: '' });
      expect(readFileSync(path.join(dir, 'address'), 'utf8')).toBe(`unix://${socket()}`);
      const info = await readShimInfo(stateDir());
      expect(info).toMatchObject({ sandboxId: SANDBOX, namespace: 'default', bundle: dir, socket: socket(), cgroupDriver: 'cgroupfs' });
      const pid = info!.pid;
      servePids.add(pid);
      // In the runtime's mount namespace, which start created; start itself is not in it.
      const ns = await boundNamespace(nsFile);
      expect(ns).toBeDefined();
      expect(namespaceOf(pid)).toEqual(ns);
      expect(namespaceOf()).not.toEqual(ns);
      // Its own session, no stdio of ours: /dev/null in, /dev/null out, the shim log as stderr.
      expect(sessionOf(pid)).toBe(pid);
      expect(readlinkSync(`/proc/${pid}/fd/0`)).toBe('/dev/null');
      expect(readlinkSync(`/proc/${pid}/fd/1`)).toBe('/dev/null');
      expect(readlinkSync(`/proc/${pid}/fd/2`)).toBe(path.join(stateDir(), 'shim.log'));
      const client = await connectTtrpc(socket());
      try {
        // The task API answers: Connect names the shim's pid; a task it does not hold is NOT_FOUND.
        const connected = decodeMessage(
          'containerd.task.v2.ConnectResponse',
          await client.call('containerd.task.v2.Task', 'Connect', new Uint8Array()),
        );
        expect(connected.shim_pid).toBe(pid);
        const state = encodeMessage('containerd.task.v2.StateRequest', { id: 'nope' });
        await expect(client.call('containerd.task.v3.Task', 'State', state)).rejects.toMatchObject({ code: 5 });
      } finally {
        await client.close();
      }
    },
    LONG,
  );

  it(
    'start for a container of the pod, or again for the sandbox, answers with the running shim',
    async () => {
      const pid = (await readShimInfo(stateDir()))!.pid;
      const dir = bundle('container', { 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': SANDBOX });
      expect(await startInProcess(CONTAINER, dir)).toEqual({ code: 0, stdout: `unix://${socket()}`, stderr: '' });
      expect(readFileSync(path.join(dir, 'address'), 'utf8')).toBe(`unix://${socket()}`);
      expect(await startInProcess(SANDBOX, path.join(root, 'bundles', 'sandbox'))).toMatchObject({ code: 0, stdout: `unix://${socket()}` });
      expect((await readShimInfo(stateDir()))!.pid).toBe(pid);
      // CRI-O names the pod with its own annotations.
      const crio = bundle('crio', { 'io.kubernetes.cri-o.ContainerType': 'container', 'io.kubernetes.cri-o.SandboxID': SANDBOX });
      expect(await startInProcess('crio-ctr', crio)).toMatchObject({ code: 0, stdout: `unix://${socket()}` });
    },
    LONG,
  );

  it('start for a container whose pod has no shim fails with one sentence', async () => {
    const dir = bundle('orphan', { 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': 'nopod' });
    const r = await startInProcess('orphan', dir);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/^containerd-shim-kata-ts-v2 start: the shim of sandbox nopod does not answer at .*\n$/);
    expect(existsSync(path.join(dir, 'address'))).toBe(false);
  });

  it(
    'SIGTERM ends serve: its socket goes, the pod state stays for delete',
    async () => {
      const pid = (await readShimInfo(stateDir()))!.pid;
      const ticks = readProcStat(pid)!.startTimeTicks;
      process.kill(pid, 'SIGTERM');
      await until('the shim to exit', async (note) => {
        note(readProcStat(pid));
        return isSameLiveProcess(pid, ticks) ? undefined : true;
      });
      servePids.delete(pid);
      expect(existsSync(socket())).toBe(false);
      expect(existsSync(path.join(stateDir(), 'shim.json'))).toBe(true);
      expect(readFileSync(path.join(stateDir(), 'shim.log'), 'utf8')).toMatch(
        /msg="shim stopped; the pod state stays for delete" namespace=\S+ sandboxId=/,
      );
    },
    LONG,
  );

  it(
    'delete for the sandbox removes the pod state and prints a DeleteResponse',
    async () => {
      const dir = path.join(root, 'bundles', 'sandbox');
      const before = Date.now();
      const r = await runBinary(
        ['-namespace', 'default', '-address', ADDRESS, '-publish-binary', 'x', '-id', SANDBOX, '-bundle', dir, 'delete'],
        '/',
      );
      expect(r.code).toBe(0);
      const response = decodeDeleteResponse(r.stdout);
      expect(response.exitStatus).toBe(EXIT_STATUS_KILLED);
      expect(response.exitedAt.getTime()).toBeGreaterThanOrEqual(before - 1000);
      // The cleanup runs in a detached child, which may outlive delete's answer.
      await until('the pod state removed', async () => (existsSync(stateDir()) ? undefined : true));
    },
    LONG,
  );

  it(
    'delete for an id nobody knows prints a DeleteResponse and exits 0',
    async () => {
      const dir = mkdtempSync(path.join(root, 'empty-'));
      const r = await runBinary(
        ['-namespace', 'default', '-address', ADDRESS, '-publish-binary', 'x', '-id', 'unknown-task', 'delete'],
        dir,
      );
      expect(r.code).toBe(0);
      // delete answers within containerd's cleanup timeout; on a loaded machine the detached
      // cleanup child may still be starting then, which delete says in one line and is not an error.
      expect(r.stderr).toMatch(/^(|containerd-shim-kata-ts-v2 delete: the cleanup of unknown-task goes on in the background\n)$/);
      expect(decodeDeleteResponse(r.stdout)).toMatchObject({ pid: 0, exitStatus: 137 });
    },
    LONG,
  );

  it(
    'a bad flag exits 2 with one sentence naming it; -v prints the version',
    async () => {
      const bad = await runBinary(['-namespace', 'default', '-bogus', 'start'], root);
      expect(bad).toMatchObject({ code: 2, stderr: 'containerd-shim-kata-ts-v2: flag provided but not defined: -bogus\n' });
      const version = await runBinary(['-v'], root);
      expect(version.code).toBe(0);
      expect(version.stdout.toString()).toMatch(/^containerd-shim-kata-ts-v2:\n {2}Version: {2}\d+\.\d+\.\d+\n/);
    },
    LONG,
  );
});
