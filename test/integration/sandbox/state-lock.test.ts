/**
 * A state directory belongs to one daemon: a second real `kata-ts serve` on the same state dir
 * (another socket) refuses at once naming the holder's pid and changes nothing of the first one's
 * running sandbox; once the holder is SIGKILLed its lock is stale and the next daemon takes it over
 * and finds the sandbox READY. One VM boot.
 */
import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { STATE_LOCK_FILE } from '../../../src/runtime/state-lock.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

/** Run a second `kata-ts serve` to its end; it must not outlive the timeout. */
async function serveOnce(configPath: string, timeoutMs: number): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', 'serve', '--config', configPath], {
    cwd: packageRoot(),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  clearTimeout(timer);
  return { code, stderr };
}

describe('one daemon per state directory', () => {
  let rt: TestRuntime;
  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime();
    await rt.start();
  });
  afterAll(async () => {
    await rt?.cleanup();
  });

  it(
    'a second daemon refuses naming the holder, changes nothing; a stale lock is taken over',
    async () => {
      const id = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'locked') })).pod_sandbox_id;
      const recordFile = path.join(rt.stateDir, 'sandboxes', `${id}.json`);
      const before = await fsp.readFile(recordFile, 'utf8');
      const lockBefore = await fsp.readFile(path.join(rt.stateDir, STATE_LOCK_FILE), 'utf8');
      expect(lockBefore.split(' ')[0]).toBe(String(rt.pid()));

      const second = { ...JSON.parse(await fsp.readFile(rt.configPath, 'utf8')), socketPath: path.join(rt.dir, 'second.sock') };
      const secondConfig = path.join(rt.dir, 'second.json');
      await fsp.writeFile(secondConfig, JSON.stringify(second));
      const { code, stderr } = await serveOnce(secondConfig, 30_000);
      expect(code).toBe(1);
      expect(stderr).toContain(`in use by kata-ts pid ${rt.pid()}`);
      // Nothing changed: the first one's record, its lock, its sandbox; the second never listened.
      expect(await fsp.readFile(recordFile, 'utf8')).toBe(before);
      expect(await fsp.readFile(path.join(rt.stateDir, STATE_LOCK_FILE), 'utf8')).toBe(lockBefore);
      await expect(fsp.stat(second.socketPath)).rejects.toThrow();
      const listed = await rt.cri.runtime.ListPodSandbox({});
      expect(listed.items.map((s) => [s.id, s.state])).toEqual([[id, 'SANDBOX_READY']]);

      // The holder dies without releasing: the lock is stale, the next daemon takes it over.
      const oldPid = rt.pid();
      process.kill(oldPid, 'SIGKILL');
      await rt.stop();
      await rt.start();
      const lines = await rt.logLines();
      expect(lines.some((l) => l.msg === 'taking over a state directory lock left by a daemon that is gone' && l.stalePid === oldPid)).toBe(
        true,
      );
      expect((await fsp.readFile(path.join(rt.stateDir, STATE_LOCK_FILE), 'utf8')).split(' ')[0]).toBe(String(rt.pid()));
      const again = await rt.cri.runtime.ListPodSandbox({});
      expect(again.items.map((s) => [s.id, s.state])).toEqual([[id, 'SANDBOX_READY']]);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
      // A graceful stop gives the lock up.
      await rt.stop();
      await expect(fsp.stat(path.join(rt.stateDir, STATE_LOCK_FILE))).rejects.toThrow();
    },
    scaledMs(240_000),
  );
});
