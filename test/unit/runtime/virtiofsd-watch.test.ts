/** A sandbox whose virtiofsd dies is noticed (and its VM ended by the manager): the watch fires once. */
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { readProcStat } from '../../../src/hypervisor/index.js';
import { VIRTIOFSD_WATCH_MS, watchVirtiofsd } from '../../../src/runtime/sandbox/virtiofsd.js';

describe('watchVirtiofsd', () => {
  it('calls onGone once the watched process is gone, and not while it runs or is not watched', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 50));
    const record = { pid: child.pid as number, startTimeTicks: readProcStat(child.pid as number)!.startTimeTicks, socketPath: '/x' };
    let watched = true;
    let gone = 0;
    const stop = watchVirtiofsd(
      () => (watched ? record : null),
      () => void gone++,
    );
    try {
      await new Promise((r) => setTimeout(r, VIRTIOFSD_WATCH_MS * 2.5));
      expect(gone).toBe(0);
      watched = false;
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
      await new Promise((r) => setTimeout(r, VIRTIOFSD_WATCH_MS * 2.5));
      expect(gone).toBe(0); // not watched: a stop in progress
      watched = true;
      await new Promise((r) => setTimeout(r, VIRTIOFSD_WATCH_MS * 2.5));
      expect(gone).toBe(1);
      await new Promise((r) => setTimeout(r, VIRTIOFSD_WATCH_MS * 2.5));
      expect(gone).toBe(1);
    } finally {
      stop();
      child.kill('SIGKILL');
    }
  });
});
