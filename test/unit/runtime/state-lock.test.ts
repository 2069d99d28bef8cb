/** The state-directory lock: exclusive, names its holder, survives a crashed holder as stale. */
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { readProcStat } from '../../../src/hypervisor/index.js';
import { acquireStateLock, STATE_LOCK_FILE } from '../../../src/runtime/state-lock.js';
import { rejection } from '../../helpers/kata-error.js';

describe('acquireStateLock', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kts-lock-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('is exclusive within one process too, and free again once released', async () => {
    const lock = await acquireStateLock(dir, silentLogger());
    expect(await readFile(path.join(dir, STATE_LOCK_FILE), 'utf8')).toBe(`${process.pid} ${lock.owner.startTimeTicks}\n`);
    expect((await rejection(acquireStateLock(dir, silentLogger()))).reason).toBe('STATE_DIR_LOCKED');
    await lock.release();
    const again = await acquireStateLock(dir, silentLogger());
    await again.release();
  });

  it('refuses while another live process holds it, naming its pid', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      await new Promise((r) => setTimeout(r, 50));
      const stat = readProcStat(child.pid as number)!;
      await writeFile(path.join(dir, STATE_LOCK_FILE), `${child.pid} ${stat.startTimeTicks}\n`);
      const err = await rejection(acquireStateLock(dir, silentLogger()));
      expect(err.reason).toBe('STATE_DIR_LOCKED');
      expect(err.message).toContain(`pid ${child.pid}`);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('takes over a lock whose holder is gone, a reused pid, or garbage', async () => {
    for (const stale of ['999999999 1\n', `${process.ppid} 1\n`, 'not a lock']) {
      await writeFile(path.join(dir, STATE_LOCK_FILE), stale);
      const lock = await acquireStateLock(dir, silentLogger());
      expect(lock.owner.pid).toBe(process.pid);
      await lock.release();
    }
  });
});
