/**
 * Starting a real `kata-ts serve` process on a config file and ending it by pid. vitest-free, so
 * that benches and the confined systemd scenarios (plain node processes) share it with the tests.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream, promises as fsp, readdirSync } from 'node:fs';
import net from 'node:net';
import { packageRoot } from '../../src/common/paths.js';
import { readProcStatFields } from '../../src/common/proc-stat.js';
import { readCmdline } from '../../src/common/procfs.js';

export interface SpawnedDaemon {
  /**
   * The daemon's own pid: the process that holds the state dir. `kata-ts serve` started outside
   * the runtime's mount namespace runs the daemon as its child inside it; this is that child.
   */
  pid: number;
  /** The process started here (`kata-ts serve` as a user starts it): the daemon's parent, or the daemon itself. */
  child: ChildProcess;
  /** SIGTERM `child` and wait (SIGKILL after 15 s), what `systemctl stop` does. Pod VMs keep running. */
  stop(): Promise<void>;
  /** SIGKILL the daemon (`pid`) and wait for `child` too: a crash (no shutdown code runs). Pod VMs keep running. */
  kill(): Promise<void>;
}

/** True when something accepts connections on the unix socket. */
export function accepts(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect(socketPath);
    sock.once('connect', () => {
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => resolve(false));
  });
}

/**
 * The daemon started as `spawned`: its child running `serve` (what `kata-ts serve` starts inside
 * the runtime's mount namespace), else `spawned` itself.
 */
export function daemonPidOf(spawned: number): number {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (readProcStatFields(pid)?.ppid !== spawned) continue;
    const argv = readCmdline(pid);
    if (argv.includes('serve') && argv.some((a) => a.endsWith('entry.ts') || a.endsWith('kata-ts.js'))) return pid;
  }
  return spawned;
}

/** The JSON lines of a daemon's log file so far. */
export async function readLogLines(logFile: string): Promise<Array<Record<string, unknown>>> {
  const text = await fsp.readFile(logFile, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

/**
 * Start `kata-ts serve --config <configPath>` with its stderr appended to `logFile`, and resolve
 * once `socketPath` accepts connections (a killed daemon's stale socket file may already exist).
 */
export async function spawnDaemon(
  configPath: string,
  socketPath: string,
  logFile: string,
  options: {
    /** Start it in this network namespace (nsenter execs node there). */
    netnsPath?: string;
  } = {},
): Promise<SpawnedDaemon> {
  const log = createWriteStream(logFile, { flags: 'a' });
  const node = [process.execPath, '--import', 'tsx', 'src/cli/entry.ts', 'serve', '--config', configPath];
  const inNetns = options.netnsPath === undefined ? node : ['nsenter', `--net=${options.netnsPath}`, '--', ...node];
  const [cmd, ...args] = inNetns as [string, ...string[]];
  const child = spawn(cmd, args, {
    cwd: packageRoot(),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  child.stderr!.pipe(log);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let up = false;
  // Bounded for a hung daemon, not sized for an idle machine: a loaded 2-core node with several
  // TCG guests took over 30 s to reach the socket (the process exiting ends the wait at once).
  for (let i = 0; i < 3000 && !up && child.exitCode === null; i++) {
    up = await accepts(socketPath);
    if (!up) await new Promise((r) => setTimeout(r, 100));
  }
  if (!up) {
    if (child.exitCode === null) child.kill('SIGKILL');
    await exited;
    throw new Error(`kata-ts did not start (config ${configPath}); log:\n${await fsp.readFile(logFile, 'utf8').catch(() => '')}`);
  }
  const pid = daemonPidOf(child.pid as number);
  /** Set by stop() and kill(): the exit that follows is the test's doing. */
  let endedHere = false;
  return {
    pid,
    child,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) {
        if (endedHere) return;
        // Gone before anyone stopped it: a crash. Its log is removed with the test's dir, so the
        // end of it is printed here, where a failing run's output keeps it.
        const tail = (await fsp.readFile(logFile, 'utf8').catch(() => '')).split('\n').slice(-40).join('\n');
        console.warn(
          `kata-ts (pid ${pid}) had exited on its own (code ${child.exitCode}, signal ${child.signalCode}); its log ends:\n${tail}`,
        );
        return;
      }
      endedHere = true;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(timer);
    },
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      endedHere = true;
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
      // `child`, when it is the daemon's parent, exits with it (and would kill it if it went first).
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
