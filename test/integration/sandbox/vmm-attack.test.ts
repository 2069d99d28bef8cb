/**
 * The VMM jail proven by attack, with real QEMU (TCG) through a real `kata-ts serve`.
 *
 * `hypervisor.qemuBinary` is a hostile program (test/fixtures/hostile/hostile-vmm.c, compiled here)
 * that the runtime starts exactly as it starts QEMU: bound into the jail, through kata-ts-jailer and
 * setpriv, with QEMU's argv, placed in its cgroup before it runs. It stands for code that took QEMU
 * over (and runs without QEMU's own seccomp filter, the harder case): it tries each attack below,
 * writes what happened beside its QMP socket, then execs the real QEMU so the pod boots and the
 * report can be read.
 *
 * Three boots: pod B (the victim: the same program without targets only execs QEMU), then the
 * daemon restarted with the targets in its environment (B's QEMU, work dir and QMP socket, a host
 * file anyone may read, a host dir anyone may write, a listener on 127.0.0.1, a host abstract
 * socket), pod A on the cold path, and a pooled VM on the pool's path. Each attack is a named test
 * per path, judged from the report and, where an attack would leave a trace on the host (a file, a
 * connection, a dead process), from the host too. The shim's path: test/integration/shim/vmm-attack.test.ts.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { type AttackReport, AttackTargets, attackReportTests, readAttackReport } from '../../helpers/hostile-vmm.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { until } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

interface Info {
  pid: number;
  workDir: string;
  confinement: { vmmDir: string | null } | null;
}

describe("a hostile program in QEMU's place: every attack fails, on the cold and the pool path", () => {
  let rt: TestRuntime;
  let targets: AttackTargets;
  let victim: Info;
  let victimStart = 0;
  const reports: Record<'cold' | 'pooled', AttackReport> = { cold: {}, pooled: {} };

  async function info(id: string): Promise<Info> {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as Info;
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    targets = await AttackTargets.create();
    rt = await createTestRuntime({ hypervisor: { qemuBinary: targets.binary } });
    await rt.start();
    const b = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'victim') })).pod_sandbox_id;
    victim = await info(b);
    victimStart = readProcStat(victim.pid)!.startTimeTicks;
    await rt.stop();

    const env = targets.env(
      { pid: victim.pid, workDir: victim.workDir, qmpSocket: path.join(victim.confinement!.vmmDir!, 'qmp.sock') },
      rt.socketPath,
    );
    Object.assign(process.env, env);
    try {
      // The cold path.
      await rt.start();
      const a = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'attacker') })).pod_sandbox_id;
      reports.cold = (await readAttackReport((await info(a)).confinement!.vmmDir!)) ?? {};
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: a });
      await rt.stop();
      // The pool's path: a pooled VM, booted by the pool, started the same way.
      const config = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { pool: Record<string, unknown> };
      config.pool.sizes = { 'kata-ts': 1 };
      await fsp.writeFile(rt.configPath, JSON.stringify(config));
      await rt.start();
      reports.pooled = await until(
        'the pooled VM to write its report',
        async () => {
          for (const f of await fsp.readdir(path.join(rt.stateDir, 'pool')).catch(() => [] as string[])) {
            if (!f.endsWith('.json')) continue;
            const doc = JSON.parse(await fsp.readFile(path.join(rt.stateDir, 'pool', f), 'utf8')) as {
              record: { confinement: { vmmDir: string } | null };
            };
            const dir = doc.record.confinement?.vmmDir;
            if (dir !== undefined) return readAttackReport(dir);
          }
          return undefined;
        },
        scaledMs(300_000),
        500,
      );
    } finally {
      for (const key of Object.keys(env)) delete process.env[key];
    }
  }, scaledMs(600_000));

  afterAll(async () => {
    await rt?.cleanup();
    await targets?.close();
  });

  for (const where of ['cold', 'pooled'] as const) {
    describe(`${where} path`, () => {
      attackReportTests(() => reports[where], it, expect);
    });
  }

  it("on the host: nothing written, no connection reached a host listener, the other pod's QEMU lives", async () => {
    expect(await targets.traces()).toEqual({ written: [], tcp: [], abstract: [], tmp: false });
    expect(isSameLiveProcess(victim.pid, victimStart)).toBe(true);
  });
});
