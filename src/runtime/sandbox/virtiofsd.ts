import path from 'node:path';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { attachVirtiofsd, isSameLiveProcess } from '../../hypervisor/index.js';
import { killAndWait, virtiofsdPidsUsing } from './orphans.js';
import type { SandboxRecord } from './record.js';

/**
 * Stop the sandbox's virtiofsd if it still runs (pid + start time; it normally exits by itself
 * once QEMU is gone). Logs what it did; never throws for a process that is already gone.
 */
export async function stopVirtiofsd(record: SandboxRecord, log: Logger): Promise<void> {
  const v = record.virtiofsd;
  if (v === null) return;
  if (isSameLiveProcess(v.pid, v.startTimeTicks)) {
    log.info({ pid: v.pid }, 'stopping virtiofsd');
    try {
      await attachVirtiofsd(v).stop();
    } catch (err) {
      log.error({ pid: v.pid, err: errorMessage(err) }, 'stopping virtiofsd failed');
      throw err;
    }
  }
  // Its sandbox child follows the parent a moment later (PR_SET_PDEATHSIG); one still serving
  // this work dir's socket when the parent had already gone by itself is ended here.
  for (const pid of await virtiofsdPidsUsing(path.dirname(v.socketPath))) {
    log.info({ pid }, 'ending what is left of virtiofsd');
    await killAndWait(pid);
  }
}

/** How often a running sandbox's virtiofsd is checked (a dead one makes every file access in the guest hang). */
export const VIRTIOFSD_WATCH_MS = 500;

/**
 * Call `onGone` once when the virtiofsd that `current()` names (pid + start time) is no longer
 * alive; `current()` returns null while nothing is to be watched (no virtio-fs, or the sandbox is
 * being stopped). Without virtiofsd the guest's every access to the shared directory blocks, so a
 * sandbox that lost it would stay READY while no container can start: the caller ends the VM.
 * Returns the function that stops watching.
 */
export function watchVirtiofsd(current: () => SandboxRecord['virtiofsd'], onGone: () => void): () => void {
  const timer = setInterval(() => {
    const v = current();
    if (v === null || isSameLiveProcess(v.pid, v.startTimeTicks)) return;
    clearInterval(timer);
    onGone();
  }, VIRTIOFSD_WATCH_MS);
  timer.unref();
  return () => clearInterval(timer);
}
