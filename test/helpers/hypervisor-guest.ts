/**
 * Integration-test support for real QEMU: guest assets (built with scripts/build-guest.sh into
 * the default directory when missing), temporary work directories, and a tracker that kills every
 * QEMU a test started, by pid, whatever happened.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { isSameLiveProcess } from '../../src/common/procfs.js';
import { DEFAULT_GUEST_DIR } from '../../src/config/defaults.js';
import { checkGuestAssets } from '../../src/hypervisor/assets.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

export interface GuestAssets {
  kernelPath: string;
  initrdPath: string;
}

/**
 * The guest kernel and initramfs; KATA_TS_GUEST_DIR overrides the default directory. Builds them
 * there when missing (a fresh machine where the setup script has not built them yet).
 */
export async function ensureGuestAssets(): Promise<GuestAssets> {
  const dir = process.env.KATA_TS_GUEST_DIR ?? DEFAULT_GUEST_DIR;
  const assets = { kernelPath: path.join(dir, 'vmlinuz'), initrdPath: path.join(dir, 'initramfs.cpio.gz') };
  if ((await checkGuestAssets(assets)).ok) return assets;
  execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'inherit', 'inherit'] });
  const check = await checkGuestAssets(assets);
  if (!check.ok) throw new Error(`guest assets still unusable after build-guest.sh: ${check.message}`);
  return assets;
}

/** A short temporary directory (unix socket paths must stay under 108 bytes). */
export function makeWorkDir(prefix = 'kvm-'): string {
  return mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** Pids of processes whose command line mentions `needle` (to prove nothing was left behind). */
export function processesMentioning(needle: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.includes(needle)) pids.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return pids;
}

/** Remembers every QEMU a test started and SIGKILLs the survivors (by pid and start time). */
export class QemuTracker {
  private readonly started: Array<{ pid: number; startTimeTicks: number }> = [];
  private readonly dirs: string[] = [];

  track<T extends { pid: number; startTimeTicks: number }>(vm: T): T {
    this.started.push({ pid: vm.pid, startTimeTicks: vm.startTimeTicks });
    return vm;
  }

  workDir(): string {
    const dir = makeWorkDir();
    this.dirs.push(dir);
    return dir;
  }

  /** Kill what is still running, wait until it is gone, remove the work directories. */
  async cleanup(): Promise<void> {
    for (const { pid, startTimeTicks } of this.started.splice(0)) {
      if (!isSameLiveProcess(pid, startTimeTicks)) continue;
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
      for (let i = 0; i < 100 && isSameLiveProcess(pid, startTimeTicks); i++) await new Promise((r) => setTimeout(r, 50));
    }
    for (const dir of this.dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  }
}
