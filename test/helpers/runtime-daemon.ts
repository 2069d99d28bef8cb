/**
 * A kata-ts daemon run as a real process (`kata-ts serve`), in a temporary state dir, with the
 * cgroupfs driver placing VMMs under a private cgroup parent that the test owns, so tests can
 * restart it, kill its VMs, and check that nothing is left behind.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream, promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';
import { criClients, type CriClients } from './cri-client.js';
import { mountedHierarchies, treeDeepestFirst } from './cgroups-private.js';
import { processesMentioning } from './hypervisor-guest.js';

export interface TestRuntime {
  dir: string;
  stateDir: string;
  socketPath: string;
  configPath: string;
  /** `kata-ts-test-<random>`: the private cgroup root every test pod's cgroup_parent starts with. */
  cgroupRoot: string;
  /** A cgroupfs-style cgroup_parent under the private root, as a kubelet would send for a pod. */
  cgroupParent(podUid: string): string;
  cri: CriClients;
  /** The running daemon's pid (changes across restart()). */
  pid(): number;
  start(): Promise<void>;
  /** SIGTERM and wait: what `systemctl stop` does. VMs keep running. */
  stop(): Promise<void>;
  restart(): Promise<void>;
  /** The daemon's JSON log lines so far. */
  logLines(): Promise<Array<Record<string, unknown>>>;
  /** Stop the daemon, kill any QEMU of this runtime, remove the private cgroups and the temp dir. */
  cleanup(): Promise<void>;
}

export async function createTestRuntime(configDoc: Record<string, unknown> = {}): Promise<TestRuntime> {
  // Short: sockets live under it and a unix socket path must fit in 108 bytes.
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-'));
  const stateDir = path.join(dir, 'state');
  const socketPath = path.join(dir, 'kata-ts.sock');
  const configPath = path.join(dir, 'config.json');
  const cgroupRoot = `kata-ts-test-${randomBytes(5).toString('hex')}`;
  await fsp.writeFile(
    configPath,
    JSON.stringify({ socketPath, stateDir, metricsAddress: null, cgroupDriver: 'cgroupfs', logLevel: 'debug', ...configDoc }, null, 2),
  );
  let child: ChildProcess | undefined;
  let cri: CriClients | undefined;
  const logFile = path.join(dir, 'daemon.log');

  const runtime: TestRuntime = {
    dir,
    stateDir,
    socketPath,
    configPath,
    cgroupRoot,
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
        stdio: ['ignore', 'inherit', 'pipe'],
      });
      child.stderr!.pipe(log);
      const exited = new Promise<number | null>((resolve) => child!.once('exit', (code) => resolve(code)));
      // Wait until the socket accepts connections: a killed daemon's stale socket file may be there.
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
    async restart() {
      await runtime.stop();
      await runtime.start();
    },
    async logLines() {
      const text = await fsp.readFile(logFile, 'utf8').catch(() => '');
      return text
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    },
    async cleanup() {
      await runtime.stop();
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
  return runtime;
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

/** Directories named `name` at the top of each hierarchy, deepest first; our QEMUs inside are killed. */
export async function cgroupDirsUnder(name: string): Promise<string[]> {
  const out: string[] = [];
  for (const m of await mountedHierarchies()) {
    const top = path.join(m.mountPoint, name);
    if (await fsp.stat(top).then(() => true, () => false)) out.push(...(await treeDeepestFirst(top)));
  }
  return out;
}

async function removeCgroupTree(name: string): Promise<void> {
  if (!name.startsWith('kata-ts-test-')) throw new Error(`refusing to remove cgroup ${name}`);
  for (let attempt = 0; attempt < 50; attempt++) {
    const dirs = await cgroupDirsUnder(name);
    if (dirs.length === 0) return;
    for (const dir of dirs) {
      const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter((p) => p !== '');
      for (const pid of procs) {
        try {
          process.kill(Number(pid), 'SIGKILL'); // only this runtime's QEMUs were ever placed here
        } catch {
          // gone
        }
      }
      await fsp.rmdir(dir).catch(() => undefined);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Everything a sandbox leaves on the host, to assert it is all gone. */
export async function leftovers(runtime: TestRuntime): Promise<{ processes: number[]; workDirs: string[]; records: string[]; cgroups: string[] }> {
  const list = async (d: string): Promise<string[]> => (await fsp.readdir(d).catch(() => [] as string[])).filter((n) => !n.startsWith('.'));
  return {
    processes: processesMentioning(path.join(runtime.stateDir, 'vm')),
    workDirs: await list(path.join(runtime.stateDir, 'vm')),
    records: (await list(path.join(runtime.stateDir, 'sandboxes'))).filter((n) => n.endsWith('.json')),
    cgroups: await cgroupDirsUnder(runtime.cgroupRoot),
  };
}

/** A minimal RunPodSandboxRequest.config for a pod with the given KEP-4112 containers. */
export function podConfig(runtime: TestRuntime, name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const uid = randomBytes(8).toString('hex');
  return {
    metadata: { name, namespace: 'kata-ts-test', uid, attempt: 0 },
    labels: { app: name, 'kata-ts.dev/test': 'true' },
    annotations: { 'kata-ts.dev/note': 'integration test' },
    log_directory: `/var/log/pods/kata-ts-test_${name}_${uid}`,
    linux: {
      cgroup_parent: runtime.cgroupParent(uid),
      security_context: { namespace_options: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } },
    },
    ...extra,
  };
}
