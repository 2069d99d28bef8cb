/**
 * A hostile guest and a hostile QEMU against a real daemon (two real boots: a target pod and a
 * bystander pod). Nothing of QEMU's is trusted by root:
 * - a QEMU that swaps its console.log for a symlink to a root-only file and dies: the file's
 *   content appears nowhere (daemon log, sandbox record, verbose status); the pod ends NOTREADY
 *   with a reason, the daemon and the bystander keep serving;
 * - a QMP peer (a stand-in for QEMU's side, a unix socket of this test) sending bytes without a
 *   newline, then garbage lines: the client gives the connection up with QMP_PROTOCOL_VIOLATION,
 *   holding no more than its bound.
 * The daemon's RSS is read before and after and must stay within a bound stated in the caps.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectQmp } from '../../../src/hypervisor/qmp/client.js';
import { QMP_LINE_MAX_BYTES } from '../../../src/hypervisor/qmp/connection.js';
import { sandboxVmmDir, sandboxWorkDir } from '../../../src/runtime/sandbox/paths.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { until } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

function rssKiB(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('VmRSS:'));
  return Number.parseInt(line?.split(/\s+/)[1] ?? '0', 10);
}

/** Every regular file under `dir`, never through a link (what a grep of the state would see). */
async function regularFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await fsp.readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await regularFiles(p)));
    else if (entry.isFile()) out.push(p);
  }
  return out;
}

describe('a hostile guest and QEMU cannot take the runtime down or read root files through it', () => {
  let rt: TestRuntime;
  let target = '';
  let bystander = '';
  let secretDir = '';
  const secret = `kts-root-only-${randomBytes(8).toString('hex')}`;
  const rss = { afterBootKiB: 0, endKiB: 0 };

  beforeAll(async () => {
    await ensureGuestAssets();
    secretDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-secret-'));
    await fsp.chmod(secretDir, 0o700);
    await fsp.writeFile(path.join(secretDir, 'shadow'), `${secret}\n`, { mode: 0o600 });
    rt = await createTestRuntime();
    await rt.start();
    target = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'hostile') })).pod_sandbox_id;
    bystander = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'bystander') })).pod_sandbox_id;
    rss.afterBootKiB = rssKiB(rt.pid());
  }, scaledMs(300_000));
  afterAll(async () => {
    await rt?.cleanup();
    if (secretDir !== '') await fsp.rm(secretDir, { recursive: true, force: true });
  });

  it('a console.log swapped for a symlink to a root-only file, then QEMU killed: the file is read nowhere, the pod is NOTREADY, the rest serves', async () => {
    const daemonPid = rt.pid();
    const vmmDir = sandboxVmmDir(sandboxWorkDir(rt.stateDir, target));
    const consoleLog = path.join(vmmDir, 'console.log');
    expect((await fsp.lstat(consoleLog)).isFile()).toBe(true);
    // What a QEMU that runs the attacker's code does in the directory it owns.
    await fsp.rm(consoleLog);
    await fsp.symlink(path.join(secretDir, 'shadow'), consoleLog);
    const status = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: target, verbose: true });
    const qemuPid = (JSON.parse(status.info.info!) as { pid: number }).pid;
    // Our daemon's QEMU, by pid.
    process.kill(qemuPid, 'SIGKILL');
    const after = await until(
      'the target pod NOTREADY',
      async () => {
        const s = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: target, verbose: true });
        const info = JSON.parse(s.info.info!) as { exit?: { reason?: string } | null };
        return s.status?.state === 'SANDBOX_NOTREADY' && info.exit?.reason !== undefined ? s : undefined;
      },
      scaledMs(30_000),
    );
    const verbose = JSON.stringify(after);
    expect(verbose).not.toContain(secret);
    expect(JSON.parse(after.info.info!).exit.reason).toBe('unexpected');
    // Give the record time to be written, then look at every file of the state and at the log.
    await until('the exit recorded', async () => {
      for (const f of await regularFiles(rt.stateDir)) {
        const text = await fsp.readFile(f, 'utf8').catch(() => '');
        if (text.includes(target) && /"phase":\s*"stopped"/.test(text)) return true;
      }
      return undefined;
    });
    for (const file of await regularFiles(rt.stateDir)) {
      expect([file, (await fsp.readFile(file, 'utf8').catch(() => '')).includes(secret)]).toEqual([file, false]);
    }
    const log = await fsp.readFile(rt.logFile, 'utf8');
    expect(log).not.toContain(secret);
    expect(log).toContain('is a symlink; it is not followed');
    // The daemon is the same process and the bystander serves.
    expect(rt.pid()).toBe(daemonPid);
    const other = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: bystander, verbose: false });
    expect(other.status?.state).toBe('SANDBOX_READY');
    expect((await rt.cri.runtime.ListPodSandbox({})).items.length).toBe(2);
    // The attacker's target was read by no one: still the root-only file it was.
    expect((await fsp.stat(path.join(secretDir, 'shadow'))).mode & 0o777).toBe(0o600);
  });

  it("a QMP peer (QEMU's side, a stand-in socket) sending bytes without a newline is given up at the bound, holding no more", async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-qmp-'));
    const socketPath = path.join(dir, 'qmp.sock');
    let sentBytes = 0;
    const server = net.createServer((s) => {
      s.on('error', () => undefined);
      s.write('{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""}, "capabilities": []}}\r\n');
      s.once('data', () => {
        // The reply to qmp_capabilities, then a flood that never ends a line.
        s.write('{"return": {}, "id": 1}\r\n');
        const chunk = Buffer.alloc(256 * 1024, 'A');
        const pump = (): void => {
          while (!s.destroyed && sentBytes < 4 * QMP_LINE_MAX_BYTES) {
            sentBytes += chunk.length;
            if (!s.write(chunk)) {
              s.once('drain', pump);
              return;
            }
          }
        };
        pump();
      });
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    try {
      const heapBefore = process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
      const qmp = await connectQmp(socketPath, { timeoutMs: 5_000 });
      const closed = await qmp.closed;
      const heapAfter = process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
      expect(closed.violation?.reason).toBe('QMP_PROTOCOL_VIOLATION');
      await expect(qmp.queryStatus()).rejects.toMatchObject({ reason: 'QMP_CLOSED' });
      // The client stopped reading at the bound: the peer could not push its 4x through.
      expect(sentBytes).toBeLessThan(4 * QMP_LINE_MAX_BYTES);
      // Holds at most the bound (plus socket chunks); generous: 3x the bound.
      expect(heapAfter - heapBefore).toBeLessThan(3 * QMP_LINE_MAX_BYTES);
      console.log(`qmp flood: peer sent ${sentBytes} bytes; heap+buffers grew ${((heapAfter - heapBefore) / 1024).toFixed(0)} KiB`);
    } finally {
      await new Promise((resolve) => server.close(resolve));
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it("the daemon's RSS stays bounded across the attacks", () => {
    rss.endKiB = rssKiB(rt.pid());
    console.log(`daemon RSS: after boots ${rss.afterBootKiB} KiB, at the end ${rss.endKiB} KiB`);
    // Generous: the attacks may make it hold at most one bounded line per pod (4 KiB ready, 8 MiB QMP)
    // and a 64 KiB tail; 64 MiB covers those and the GC's slack many times over.
    expect(rss.endKiB - rss.afterBootKiB).toBeLessThan(64 * 1024);
  });
});
