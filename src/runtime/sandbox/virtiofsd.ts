import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { attachVirtiofsd, isSameLiveProcess } from '../../hypervisor/index.js';
import type { SandboxRecord } from './record.js';

/**
 * Stop the sandbox's virtiofsd if it still runs (pid + start time; it normally exits by itself
 * once QEMU is gone). Logs what it did; never throws for a process that is already gone.
 */
export async function stopVirtiofsd(record: SandboxRecord, log: Logger): Promise<void> {
  const v = record.virtiofsd;
  if (v === null || !isSameLiveProcess(v.pid, v.startTimeTicks)) return;
  log.info({ pid: v.pid }, 'stopping virtiofsd');
  try {
    await attachVirtiofsd(v).stop();
  } catch (err) {
    log.error({ pid: v.pid, err: errorMessage(err) }, 'stopping virtiofsd failed');
    throw err;
  }
}
