/**
 * A kata-ts daemon run as a real process (`kata-ts serve`) for benches: temporary state dir and
 * socket, the cgroupfs driver placing VMMs under a private cgroup parent `kata-ts-bench-<random>`
 * that the bench creates through the runtime and removes afterwards. The approach is the one of
 * test/helpers/runtime-daemon.ts (which cannot be imported outside vitest: its CRI helper imports
 * vitest); the process and cgroup helpers it builds on are shared.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream, promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';
import { mountedHierarchies, treeDeepestFirst } from '../../test/helpers/cgroups-private.js';
import { processesMentioning } from '../../test/helpers/hypervisor-guest.js';
import { criClients, type CriClients } from './cri.js';

const CGROUP_PREFIX = 'kata-ts-bench-';

export interface BenchDaemon {
  /** Short temp dir (unix socket paths must fit in 108 bytes); the bench may put its own files here. */
  dir: string;
  stateDir: string;
  socketPath: string;
  logFile: string;
  /** A cgroupfs-style cgroup_parent under the private root, as a kubelet would send for a pod. */
  cgroupParent(podUid: string): string;
  cri: CriClients;
  /** The daemon's pid (the node process itself: spawned without a shell). */
  pid(): number;
  start(): Promise<void>;
  /** SIGTERM and wait (SIGKILL after 15 s). VMs keep running: remove sandboxes through the CRI first. */
  stop(): Promise<void>;
  /** Stop the daemon, kill any process still naming the temp dir, remove the private cgroups and the dir. */
  cleanup(): Promise<void>;
}

export async function createBenchDaemon(configDoc: Record<string, unknown> = {}): Promise<BenchDaemon> {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ktb-'));
  const stateDir = path.join(dir, 'state');
  const socketPath = path.join(dir, 'kata-ts.sock');
  const configPath = path.join(dir, 'config.json');
  const logFile = path.join(dir, 'daemon.log');
  const cgroupRoot = `${CGROUP_PREFIX}${randomBytes(5).toString('hex')}`;
  // logLevel info, as a deployment would run it: debug logging would tax the daemon's side only.
  await fsp.writeFile(
    configPath,
    JSON.stringify({ socketPath, stateDir, metricsAddress: null, cgroupDriver: 'cgroupfs', logLevel: 'info', ...configDoc }, null, 2),
  );
  let child: ChildProcess | undefined;
  let cri: CriClients | undefined;

  const daemon: BenchDaemon = {
    dir,
    stateDir,
    socketPath,
    logFile,
    cgroupParent: (podUid) => `/${cgroupRoot}/pod${podUid}`,
    get cri(): CriClients {
      if (cri === undefined) throw new Error('daemon not started');
      return cri;
    },
    pid: () => child?.pid ?? -1,
    async start() {
      const log = createWriteStream(logFile, { flags: 'a' });
      child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', 'serve', '--config', configPath], {
        cwd: packageRoot(),
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      child.stderr!.pipe(log);
      const exited = new Promise<void>((resolve) => child!.once('exit', () => resolve()));
      let up = false;
      for (let i = 0; i < 300 && !up && child.exitCode === null; i++) {
        up = await accepts(socketPath);
        if (!up) await new Promise((r) => setTimeout(r, 100));
      }
      if (!up) {
        child.kill('SIGKILL');
        await exited;
        throw new Error(`kata-ts did not start; log:\n${await fsp.readFile(logFile, 'utf8').catch(() => '')}`);
      }
      cri = criClients(socketPath);
    },
    async stop() {
      cri?.close();
      cri = undefined;
      const c = child;
      if (c === undefined || c.exitCode !== null || c.signalCode !== null) return;
      const exited = new Promise((resolve) => c.once('exit', resolve));
      c.kill('SIGTERM');
      const timer = setTimeout(() => c.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(timer);
    },
    async cleanup() {
      await daemon.stop();
      // Safety net only: every QEMU of this run names a socket inside `dir` (the runtime's under
      // state/vm/, the bench's bare ones under bare-*/); normally all were stopped already.
      for (const pid of processesMentioning(dir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await removeCgroupTree(cgroupRoot);
      await fsp.rm(dir, { recursive: true, force: true });
    },
  };
  return daemon;
}

function accepts(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect(socketPath);
    sock.once('connect', () => {
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => resolve(false));
  });
}

/** The private tree in every hierarchy, deepest first. Only this run's QEMUs were ever placed there. */
async function cgroupDirsUnder(name: string): Promise<string[]> {
  const out: string[] = [];
  for (const m of await mountedHierarchies()) {
    const top = path.join(m.mountPoint, name);
    if (await fsp.stat(top).then(() => true, () => false)) out.push(...(await treeDeepestFirst(top)));
  }
  return out;
}

async function removeCgroupTree(name: string): Promise<void> {
  if (!name.startsWith(CGROUP_PREFIX)) throw new Error(`refusing to remove cgroup ${name}`);
  for (let attempt = 0; attempt < 50; attempt++) {
    const dirs = await cgroupDirsUnder(name);
    if (dirs.length === 0) return;
    for (const dir of dirs) {
      const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter((p) => p !== '');
      for (const pid of procs) {
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          // gone
        }
      }
      await fsp.rmdir(dir).catch(() => undefined);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`cgroup tree ${name} could not be removed`);
}
