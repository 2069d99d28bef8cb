/**
 * The VMM jail proven by attack on the shim's path: kata-ts behind the real containerd (Debian's
 * 1.6.20), the shim's `hypervisor.qemuBinary` the hostile program of test/fixtures/hostile/
 * (test/integration/sandbox/vmm-attack.test.ts runs the same attacks on the daemon's cold and pool
 * paths). Two pods: the victim (the program without targets only execs QEMU), then, with the
 * targets exported by the shim's wrapper, the attacker. Each attack is a named test.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { randomUUID } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { type AttackReport, AttackTargets, attackReportTests, readAttackReport } from '../../helpers/hostile-vmm.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`the shim's attack test skipped: ${MISSING}`);

describe.skipIf(MISSING !== null)("a hostile program in QEMU's place behind containerd: every attack fails on the shim's path", () => {
  const node = new ShimNode('/tmp/kta-');
  let targets: AttackTargets;
  let report: AttackReport = {};
  let victim = { pid: 0, startTicks: 0 };
  const pods: string[] = [];
  const sandboxConfig = async (name: string): Promise<PodSandboxConfig> => {
    const uid = randomUUID();
    return {
      metadata: { name, uid, namespace: 'default', attempt: 0 },
      log_directory: await node.podLogDir(name, uid),
      linux: { cgroup_parent: `/kubepods/burstable/pod${uid}` },
    };
  };
  /** The pod's QEMU and its QMP socket (from its command line). */
  const qemuOf = (podId: string): { pid: number; qmpSocket: string } => {
    const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
    const [pid] = liveProcessesMentioning(podDir).filter((p) =>
      readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('/usr/bin/qemu-system'),
    );
    if (pid === undefined) throw new Error(`no QEMU for pod ${podId}`);
    const qmp = /id=qmp,path=([^,\0]+)/.exec(readFileSync(`/proc/${pid}/cmdline`, 'utf8'));
    return { pid, qmpSocket: qmp![1]! };
  };
  const runPod = async (name: string): Promise<string> => {
    const id = (
      await node.cri.runtime.RunPodSandbox(
        { config: await sandboxConfig(name), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    pods.push(id);
    return id;
  };

  beforeAll(async () => {
    targets = await AttackTargets.create();
    await node.start({ shimConfig: { hypervisor: { ...guestDirConfig(), qemuBinary: targets.binary } } });
    const v = qemuOf(await runPod('victim'));
    victim = { pid: v.pid, startTicks: readProcStat(v.pid)!.startTimeTicks };
    // The shim's wrapper exports the targets from now on: the next pod's QEMU inherits them.
    const wrapper = path.join(node.binDir, 'containerd-shim-kata-ts-v2');
    const env = targets.env({ pid: v.pid, workDir: path.dirname(path.dirname(v.qmpSocket)), qmpSocket: v.qmpSocket }, node.ctrd.criSocket);
    const script = await fsp.readFile(wrapper, 'utf8');
    const exports = Object.entries(env).map(([k, value]) => `export ${k}='${value}'`);
    await fsp.writeFile(wrapper, script.replace('#!/bin/sh\n', `#!/bin/sh\n${exports.join('\n')}\n`));
    const attacker = qemuOf(await runPod('attacker'));
    report = (await readAttackReport(path.dirname(attacker.qmpSocket))) ?? {};
  }, scaledMs(600_000));

  afterAll(async () => {
    for (const id of pods) {
      await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
      await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
    }
    await node.stop();
    await targets?.close();
  });

  attackReportTests(() => report, it, expect);

  it("on the host: nothing written, no connection reached a host listener, the other pod's QEMU lives", async () => {
    expect(await targets.traces()).toEqual({ written: [], tcp: [], abstract: [], tmp: false });
    expect(isSameLiveProcess(victim.pid, victim.startTicks)).toBe(true);
  });
});
