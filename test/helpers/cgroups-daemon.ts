/**
 * A real `kata-ts serve` process started in whatever namespaces the caller runs in (the confined
 * systemd harness's, for the scenarios in test/harness/systemd/), with a config file of the
 * caller's choosing. vitest-free, like cgroups-cri.ts. Ended only by pid: SIGTERM, then SIGKILL.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type PlainCri, plainCri } from './cgroups-cri.js';
import { readLogLines, spawnDaemon } from './daemon-process.js';
import { guestDirConfig } from './runtime-daemon.js';

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
  const hypervisor = { ...guestDirConfig(), ...(config.hypervisor as Record<string, unknown> | undefined) };
  await fsp.writeFile(
    configPath,
    // No CNI: the host's network is never touched by tests (see test/helpers/network-node.ts). The
    // runtime's mount namespace is bound in `dir`, inside the caller's namespaces, which end with it.
    JSON.stringify(
      {
        socketPath,
        stateDir,
        metricsAddress: null,
        logLevel: 'debug',
        network: { mode: 'none' },
        mountNamespacePath: path.join(dir, 'mntns', 'mnt'),
        ...config,
        hypervisor,
      },
      null,
      2,
    ),
  );
  const daemon = await spawnDaemon(configPath, socketPath, logFile);
  const cri = plainCri(socketPath);
  return {
    dir,
    stateDir,
    socketPath,
    configPath,
    pid: daemon.pid,
    cri,
    logLines: () => readLogLines(logFile),
    async stop() {
      cri.close();
      await daemon.stop();
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
