/**
 * A kill in flight across an agent reconnect, with real parts: a pod VM booted by a real
 * `kata-ts serve` (TCG, the installed guest or KATA_TS_GUEST_DIR, the real agent), then, with
 * the daemon stopped (its VM runs on; QEMU's agent and QMP sockets serve one client each), this
 * test's own AgentClient with a 1 s keepalive.
 *
 * The guest stops answering the way a loaded host makes it: its vCPUs are stopped through QMP
 * (`stop`, what a paused pod gets; no host process is signalled), a SIGKILL of a running
 * container is sent meanwhile, the keepalive gives up on the silent guest and ends the session,
 * and the vCPUs run again (`cont`). The kill must then go through on the next session within its
 * deadline (the container dies of signal 9), where before it failed with the keepalive's
 * UNAVAILABLE although the agent was fine. One boot.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../../src/agent-client/index.js';
import { createLogger } from '../../../src/common/logger.js';
import { connectQmp } from '../../../src/hypervisor/qmp/client.js';
import { guestProbeSpec } from '../../helpers/guest-oci-spec.js';
import { until } from '../../helpers/poll.js';
import { createTestRuntime, guestDirConfig, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';

interface Info {
  workDir: string;
  confinement: { vmmDir: string | null } | null;
  guestPod: { pausePid: number } | null;
}

/** busybox `sleep` in the pod's PID, IPC and UTS namespaces, on a rootfs in the shared directory. */
const sleeperSpec = (pausePid: number) =>
  guestProbeSpec({ pausePid, args: ['/bin/busybox', 'sleep', '1000'], cgroupsPath: '/kata-ts/sleeper' });

describe('an idempotent kill in flight when the agent session ends (real guest agent)', () => {
  let rt: TestRuntime;
  beforeAll(async () => {
    rt = await createTestRuntime({ hypervisor: guestDirConfig() });
    await rt.start();
  });
  afterAll(async () => {
    await rt?.cleanup();
  });

  it('a SIGKILL sent while the guest is stopped, past a missed keepalive, is sent again on the next session and kills', async () => {
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'retrypod') });
    const status = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    const info = JSON.parse(status.info.info!) as Info;
    const socketDir = info.confinement?.vmmDir ?? info.workDir;
    const rootfs = path.join(info.workDir, 'shared', 'containers', 'sleeper', 'rootfs');
    await fsp.mkdir(path.join(rootfs, 'bin'), { recursive: true });
    for (const dir of ['proc', 'dev', 'sys', 'tmp']) await fsp.mkdir(path.join(rootfs, dir));
    await fsp.copyFile('/bin/busybox', path.join(rootfs, 'bin', 'busybox'));
    await fsp.chmod(path.join(rootfs, 'bin', 'busybox'), 0o755);

    await rt.stop();
    const lines: Array<{ msg: string }> = [];
    const logger = createLogger({ level: 'warn', destination: { write: (line: string) => void lines.push(JSON.parse(line)) } });
    const agent = await AgentClient.connect(
      { socketPath: path.join(socketDir, 'agent.sock'), logger, hostVersion: 'test', keepaliveIntervalMs: 1000, minBackoffMs: 100 },
      60_000,
    );
    const qmp = await connectQmp(path.join(socketDir, 'qmp.sock'));
    let stopped = false;
    try {
      await agent.createContainer(
        {
          containerId: 'sleeper',
          ociConfigJson: JSON.stringify(sleeperSpec(info.guestPod!.pausePid)),
          rootfsPath: '/run/kata-ts/shared/containers/sleeper/rootfs',
          stdio: 'STDIO_MODE_PIPES',
        },
        { timeoutMs: 60_000 },
      );
      await agent.startContainer('sleeper', { timeoutMs: 60_000 });
      const firstSession = agent.connection.currentSession;

      await qmp.stop();
      stopped = true;
      const kill = agent.signalContainer('sleeper', 9, true, { timeoutMs: 180_000 }).then(
        () => 'done',
        (err: unknown) => err,
      );
      // The keepalive ends the session on the silent guest (the kill still unanswered).
      await until('the keepalive to end the session', async () => (firstSession?.closed === true ? true : undefined), 60_000);
      await qmp.cont();
      stopped = false;

      expect(await kill).toBe('done');
      expect(agent.connection.currentSession).not.toBe(firstSession);
      expect(lines.map((l) => l.msg)).toContain('the agent session ended under an idempotent call; sending it again on the next session');
      const exit = await agent.waitContainer('sleeper', { timeoutMs: 60_000 });
      expect(exit.signal === 9 || exit.exitCode === 137).toBe(true);
      await agent.deleteContainer('sleeper', true, { timeoutMs: 60_000 });
    } finally {
      if (stopped) await qmp.cont().catch(() => undefined);
      qmp.close();
      agent.close();
    }

    await rt.start();
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    expect(await leftovers(rt)).toMatchObject({ processes: [], workDirs: [] });
  });
});
