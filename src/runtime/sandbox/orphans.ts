import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { readCmdline, readProcStat } from '../../hypervisor/index.js';

/**
 * QEMU processes whose command line names a socket inside `workDir`. Used only for a sandbox
 * whose creation was cut short by a daemon crash before its pid was recorded: the work dir is
 * unique to that sandbox, so a QEMU naming it is ours and nobody else's.
 */
export async function qemuPidsUsing(workDir: string, procRoot = '/proc'): Promise<number[]> {
  const prefix = `path=${path.join(workDir, '')}`.replaceAll(',', ',,');
  const pids: number[] = [];
  for (const entry of await fsp.readdir(procRoot)) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const pid = Number(entry);
    const argv = readCmdline(pid, procRoot);
    if (!path.basename(argv[0] ?? '').startsWith('qemu-system')) continue;
    if (argv.some((a) => a.includes(prefix))) pids.push(pid);
  }
  return pids;
}

/**
 * virtiofsd processes whose socket is inside `workDir`: a creation cut short between starting
 * virtiofsd and recording its pid. Same reasoning as qemuPidsUsing (the work dir is unique).
 */
export async function virtiofsdPidsUsing(workDir: string, procRoot = '/proc'): Promise<number[]> {
  const prefix = `--socket-path=${path.join(workDir, '')}`;
  const pids: number[] = [];
  for (const entry of await fsp.readdir(procRoot)) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const pid = Number(entry);
    const argv = readCmdline(pid, procRoot);
    if (!path.basename(argv[0] ?? '').startsWith('virtiofsd')) continue;
    if (argv.some((a) => a.startsWith(prefix))) pids.push(pid);
  }
  return pids;
}

/**
 * swtpm processes whose control socket (or state) is inside `workDir`: a creation cut short
 * between starting swtpm and recording its pid. Same reasoning as qemuPidsUsing.
 */
export async function swtpmPidsUsing(workDir: string, procRoot = '/proc'): Promise<number[]> {
  const inside = path.join(workDir, '');
  const pids: number[] = [];
  for (const entry of await fsp.readdir(procRoot)) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const pid = Number(entry);
    const argv = readCmdline(pid, procRoot);
    if (!path.basename(argv[0] ?? '').startsWith('swtpm')) continue;
    if (argv.some((a) => a.includes(`path=${inside}`) || a.includes(`dir=${inside}`))) pids.push(pid);
  }
  return pids;
}

/** SIGKILL a process and wait (up to `timeoutMs`) until it is gone. */
export async function killAndWait(pid: number, timeoutMs = 5000): Promise<void> {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    // A zombie is gone for our purposes: its parent (init, or us) reaps it.
    const stat = readProcStat(pid);
    if (stat === undefined || stat.state === 'Z' || stat.state === 'X') return;
    await new Promise((r) => setTimeout(r, 20));
  }
}
