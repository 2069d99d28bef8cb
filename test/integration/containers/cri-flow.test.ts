/**
 * The crictl sequence of issue 13 through the CRI socket of a real `kata-ts serve`, with real QEMU
 * (TCG), the real guest agent and crun in the guest and real virtio-fs: one pod VM, several
 * containers in it, and a daemon restart in the middle. Covered: exit 0 / exit 3 / killed by stop
 * / OOM with their reasons, logs (partial lines, ReopenContainerLog, nothing lost or repeated
 * across the restart), ExecSync (output, exit code, timeout that kills), stats that move with CPU
 * use, GetContainerEvents, and escape attempts through the shared directory.
 */

import { promises as fsp } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { type ClientReadableStream, status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerEventResponse__Output } from '../../../src/generated/runtime/v1/ContainerEventResponse.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { criLogLines, until, untilLogLines } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

/**
 * The restart test's log waits end on progress, not on a clock; this is only the backstop for
 * ticks that trickle in forever. A loaded two-core machine took over four minutes for the test.
 */
const RESTART_TEST_TIMEOUT_MS = scaledMs(480_000);

const APPLETS = ['sleep', 'yes', 'head', 'dd', 'kill', 'mknod', 'ln', 'wc', 'printf', 'hostname', 'grep', 'stat'];

describe('the crictl sequence in a pod VM (real QEMU, crun in the guest, virtio-fs)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  let sid: string;
  let sandboxConfig: Record<string, unknown>;
  let logDir: string;
  const events: ContainerEventResponse__Output[] = [];
  let eventStream: ClientReadableStream<ContainerEventResponse__Output> | undefined;

  const status_ = async (id: string) => (await rt.cri.runtime.ContainerStatus({ container_id: id })).status!;
  const create = async (name: string, extra: Record<string, unknown>) =>
    (
      await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name, attempt: 0 }, image: { image }, log_path: `${name}.log`, ...extra },
        sandbox_config: sandboxConfig,
      })
    ).container_id;
  const start = (id: string) => rt.cri.runtime.StartContainer({ container_id: id });
  const exited = (id: string) =>
    until(`${id} to exit`, async (note) => {
      const s = await status_(id);
      note({ state: s.state, reason: s.reason, exit_code: s.exit_code });
      return s.state === 'CONTAINER_EXITED' ? s : undefined;
    });
  const exec = (id: string, cmd: string[], timeout = 0) => rt.cri.runtime.ExecSync({ container_id: id, cmd, timeout });
  const watchEvents = () => {
    eventStream = rt.cri.runtime.GetContainerEvents({});
    eventStream.on('data', (e: ContainerEventResponse__Output) => events.push(e));
    eventStream.on('error', () => undefined);
  };

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
    });
    await allowLoopbackRegistries(rt);
    await rt.start();
    watchEvents();
    await rt.cri.image.PullImage({ image: { image } });
    logDir = path.join(rt.dir, 'pod-logs');
    sandboxConfig = { ...podConfig(rt, 'flow'), hostname: 'flow-pod', log_directory: logDir };
    sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
  });

  afterAll(async () => {
    eventStream?.cancel();
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) {
        await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
        await fsp
          .cp(path.join(rt.stateDir, 'vm'), `${keep}.vm`, { recursive: true, filter: (src) => !src.includes('/shared') })
          .catch(() => undefined);
      }
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it('exit 0 and exit 3: reasons, times, logs with a partial line', async () => {
    const ok = await create('ok', { command: ['sh', '-c', 'echo hello; printf partial'] });
    const bad = await create('bad', { command: ['sh', '-c', 'echo oops >&2; exit 3'] });
    await start(ok);
    // The kubelet opens the log as soon as StartContainer returns: the file is there by then.
    expect((await fsp.stat(path.join(logDir, 'ok.log'))).isFile()).toBe(true);
    await start(bad);
    const s0 = await exited(ok);
    const s3 = await exited(bad);
    expect(s0).toMatchObject({ exit_code: 0, reason: 'Completed' });
    expect(s3).toMatchObject({ exit_code: 3, reason: 'Error' });
    expect(BigInt(s3.started_at)).toBeGreaterThan(0n);
    expect(BigInt(s3.finished_at)).toBeGreaterThanOrEqual(BigInt(s3.started_at));
    await untilLogLines('the ok log', [s0.log_path], (lines) => lines.length === 2);
    expect(await criLogLines(s0.log_path)).toEqual(['stdout F hello', 'stdout P partial']);
    expect(await criLogLines(s3.log_path)).toEqual(['stderr F oops']);
  });

  it('a running container: list, ExecSync, timeout kills, stats move, escapes fail', async () => {
    const hostDir = path.join(rt.dir, 'volume');
    await fsp.mkdir(hostDir);
    await fsp.writeFile(path.join(rt.dir, 'host-secret'), 'do not read');
    await fsp.symlink('/', path.join(hostDir, 'to-root'));
    await fsp.symlink('..', path.join(hostDir, 'up'));
    await fsp.writeFile(path.join(hostDir, 'data.txt'), 'volume data');
    const run = await create('runner', {
      // Ignores SIGTERM (the shell is not the PID namespace's init: the pod's pause is).
      command: ['sh', '-c', 'trap "" TERM; while true; do :; done'],
      mounts: [{ container_path: '/vol', host_path: hostDir, readonly: true }],
    });
    await start(run);
    const { containers } = await rt.cri.runtime.ListContainers({
      filter: { state: { state: 'CONTAINER_RUNNING' } },
    });
    expect(containers.map((c) => c.id)).toContain(run);

    const host = await exec(run, ['cat', '/etc/hostname']);
    expect([host.stdout.toString(), host.exit_code]).toEqual(['flow-pod\n', 0]);
    expect((await exec(run, ['sh', '-c', 'echo e >&2; exit 7'])).exit_code).toBe(7);
    await expectGrpcError(exec(run, ['sleep', '4242'], 2), status.DEADLINE_EXCEEDED);
    expect((await exec(run, ['sh', '-c', 'cat /proc/[0-9]*/cmdline'])).stdout.toString()).not.toContain('4242');

    // Stats: CPU used by the busy loop grows between two samples; the pod's stats include it.
    const cpu = async () =>
      BigInt(
        (
          await rt.cri.runtime.ContainerStats({
            container_id: run,
          })
        ).stats!.cpu!.usage_core_nano_seconds!.value,
      );
    const first = await cpu();
    await new Promise((r) => setTimeout(r, 1500));
    expect(await cpu()).toBeGreaterThan(first);
    const pod = await rt.cri.runtime.PodSandboxStats({
      pod_sandbox_id: sid,
    });
    expect(pod.stats!.linux!.containers.map((c) => c.attributes!.id)).toContain(run);

    // Escapes through the shared directory: the volume's symlinks resolve inside the guest, the
    // mount is read-only, a device node is refused by the device cgroup.
    expect((await exec(run, ['cat', '/vol/data.txt'])).stdout.toString()).toBe('volume data');
    const secret = path.join(rt.dir, 'host-secret');
    expect((await exec(run, ['cat', `/vol/to-root${secret}`])).exit_code).not.toBe(0);
    expect((await exec(run, ['sh', '-c', `cat /vol/up/host-secret /vol/../host-secret ${secret}`])).stdout.toString()).not.toContain(
      'do not read',
    );
    expect((await exec(run, ['sh', '-c', 'echo x > /vol/new'])).exit_code).not.toBe(0);
    expect((await exec(run, ['sh', '-c', 'mknod /tmp/mem c 1 1 && head -c 1 /tmp/mem'])).exit_code).not.toBe(0);
    expect((await exec(run, ['ls', '/run/kata-ts/shared'])).exit_code).not.toBe(0);

    // stop -t 2: SIGTERM is ignored, so SIGKILL after 2 s.
    await rt.cri.runtime.StopContainer({ container_id: run, timeout: 2 });
    expect(await status_(run)).toMatchObject({ state: 'CONTAINER_EXITED', exit_code: 137, reason: 'Error' });
    await rt.cri.runtime.StopContainer({ container_id: run, timeout: 2 });
  });

  it('a socket as a hostPath source is refused at CreateContainer', async () => {
    const sock = path.join(rt.dir, 's.sock');
    const server = net.createServer().listen(sock);
    try {
      await expectGrpcError(
        create('sock', { command: ['true'], mounts: [{ container_path: '/s.sock', host_path: sock }] }),
        status.INVALID_ARGUMENT,
        'CONTAINER_MOUNT_SOURCE_UNSUPPORTED',
      );
    } finally {
      server.close();
    }
  });

  it('OOM in a tiny memory limit: OOMKilled', async () => {
    const hog = await create('hog', {
      command: ['sh', '-c', 'x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done'],
      linux: { resources: { memory_limit_in_bytes: String(16 * 1024 * 1024) } },
    });
    await start(hog);
    expect(await exited(hog)).toMatchObject({ reason: 'OOMKilled', exit_code: 137 });
  });

  it(
    'a daemon restart in the middle: the container keeps running, its log has every line once; reopen; rm and stopp',
    async () => {
      const ticker = await create('ticker', {
        command: ['sh', '-c', 'i=0; while [ $i -lt 400 ]; do echo tick-$i; i=$((i+1)); sleep 0.05; done; sleep 1000'],
      });
      await start(ticker);
      const logPath = (await status_(ticker)).log_path;
      await untilLogLines('a few ticks', [logPath], (lines) => lines.length > 10);
      eventStream?.cancel();
      await rt.restart();
      watchEvents();
      expect((await status_(ticker)).state).toBe('CONTAINER_RUNNING');
      await untilLogLines('more ticks', [logPath], (lines) => lines.length > 100);
      await fsp.rename(logPath, `${logPath}.1`);
      await rt.cri.runtime.ReopenContainerLog({ container_id: ticker });
      // On a busy two-core machine under TCG the 400 ticks take minutes, not the 20 s of sleeps: wait
      // as long as ticks keep coming (across the rotated file and the reopened one), not a fixed time.
      await untilLogLines('all ticks', [`${logPath}.1`, logPath], (lines) => lines.some((l) => l.endsWith('tick-399')));
      const all = [...(await criLogLines(`${logPath}.1`)), ...(await criLogLines(logPath))];
      expect(all).toEqual(Array.from({ length: 400 }, (_, i) => `stdout F tick-${i}`));
      expect((await exec(ticker, ['echo', 'after restart'])).stdout.toString()).toBe('after restart\n');

      await rt.cri.runtime.RemoveContainer({ container_id: ticker });
      await expectGrpcError(status_(ticker), status.NOT_FOUND);
      await until('the deleted event', async (note) => {
        note(events.filter((e) => e.container_id === ticker).map((e) => e.container_event_type));
        return events.some((e) => e.container_id === ticker && e.container_event_type === 'CONTAINER_DELETED_EVENT') ? true : undefined;
      });
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      const { containers } = await rt.cri.runtime.ListContainers({
        filter: { pod_sandbox_id: sid },
      });
      expect(containers.every((c) => c.state === 'CONTAINER_EXITED')).toBe(true);
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      // Nothing of the pod stays mounted, in the runtime's mount namespace or on the host.
      expect((await rt.mountinfo()).includes(rt.stateDir)).toBe(false);
      // On the host, only the runtime's namespace itself (its file and the private bind of its
      // directory) lies under the test's dir.
      const nsDir = path.dirname(rt.mountNamespacePath);
      const hostMounts = (await fsp.readFile('/proc/self/mountinfo', 'utf8'))
        .split('\n')
        .map((l) => l.split(' ')[4] ?? '')
        .filter((p) => p.startsWith(rt.dir) && !p.startsWith(nsDir));
      expect(hostMounts).toEqual([]);
    },
    RESTART_TEST_TIMEOUT_MS,
  );
});
