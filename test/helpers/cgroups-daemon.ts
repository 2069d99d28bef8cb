/**
 * A real `kata-ts serve` process started in whatever namespaces the caller runs in (the confined
 * systemd harness's, for the scenarios in test/harness/systemd/), with a config file of the
 * caller's choosing. vitest-free, like cgroups-cri.ts. Ended only by pid: SIGTERM, then SIGKILL.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';
import { plainCri, type PlainCri } from './cgroups-cri.js';

export interface DaemonProcess {
  dir: string;
  stateDir: string;
  socketPath: string;
  configPath: string;
  pid: number;
  cri: PlainCri;
  /** SIGTERM and wait (SIGKILL after 15 s). Pod VMs keep running, as with `systemctl stop`. */
  stop(): Promise<void>;
  /** The daemon's JSON log lines so far. */
  logLines(): Promise<Array<Record<string, unknown>>>;
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

/**
 * Writes `<dir>/config.json` (socket, state dir, no metrics endpoint, debug log, then `config`)
 * and starts the daemon on it; resolves once its socket accepts connections. `dir` must be short:
 * the socket lives in it and a unix socket path must fit in 108 bytes.
 */
export async function startDaemonProcess(dir: string, config: Record<string, unknown>): Promise<DaemonProcess> {
  await fsp.mkdir(dir, { recursive: true });
  const socketPath = path.join(dir, 'kata-ts.sock');
  const stateDir = path.join(dir, 'state');
  const configPath = path.join(dir, 'config.json');
  const logFile = path.join(dir, 'daemon.log');
  await fsp.writeFile(configPath, JSON.stringify({ socketPath, stateDir, metricsAddress: null, logLevel: 'debug', ...config }, null, 2));
  const log = createWriteStream(logFile, { flags: 'a' });
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', 'serve', '--config', configPath], {
    cwd: packageRoot(),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  child.stderr!.pipe(log);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const logLines = async (): Promise<Array<Record<string, unknown>>> => {
    const text = await fsp.readFile(logFile, 'utf8').catch(() => '');
    return text
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  };
  let up = false;
  for (let i = 0; i < 300 && !up && child.exitCode === null; i++) {
    up = await accepts(socketPath);
    if (!up) await new Promise((r) => setTimeout(r, 100));
  }
  if (!up) {
    if (child.exitCode === null) child.kill('SIGKILL');
    await exited;
    throw new Error(`kata-ts did not start (config ${configPath}); log:\n${await fsp.readFile(logFile, 'utf8').catch(() => '')}`);
  }
  const cri = plainCri(socketPath);
  return {
    dir,
    stateDir,
    socketPath,
    configPath,
    pid: child.pid as number,
    cri,
    logLines,
    async stop() {
      cri.close();
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** What a daemon's state dir still holds: VM work dirs and sandbox records (dot files ignored). */
export async function stateLeftovers(stateDir: string): Promise<{ workDirs: string[]; records: string[] }> {
  const list = async (d: string): Promise<string[]> => (await fsp.readdir(d).catch(() => [] as string[])).filter((n) => !n.startsWith('.'));
  return {
    workDirs: await list(path.join(stateDir, 'vm')),
    records: (await list(path.join(stateDir, 'sandboxes'))).filter((n) => n.endsWith('.json')),
  };
}
