/**
 * A daemon crash (SIGKILL, no shutdown code) while containers run in a real pod VM (TCG, the real
 * agent and crun in the guest): a container that writes and exits while the daemon is down is
 * found EXITED after the restart with its exit code, finish time and reason, its log holds every
 * line once (those written before the crash, while down, and the unterminated tail), and the
 * event stream after the restart reports the stop. A tty container runs through the same crash:
 * its terminal output is logged as stdout (stderr included, as the CRI log format wants for tty).
 * Then the agent inside the guest is killed (SIGKILL, from a container in the guest's root PID
 * namespace) and restarted by the guest's init: the output the containers write meanwhile is
 * kept by the reaper's spool, so the CRI logs have every line once; exec and stop still work.
 *
 * Last, in the same VM: a CRI device (/dev/fuse) mapped to the guest's own node (devices.ts).
 *
 * The containers wait for a file the test creates in a hostPath volume while the daemon is dead,
 * so "exits while the daemon is down" does not depend on timing.
 */

import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { criLogLines, until } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const APPLETS = ['sleep', 'printf', 'touch', 'cat', 'grep', 'kill', 'stat', 'head', 'mknod'];

interface Event {
  container_id: string;
  container_event_type: string;
}

const exists = (file: string) =>
  fsp.stat(file).then(
    () => true,
    () => undefined,
  );

describe('a daemon crash while containers run in a pod VM (real QEMU, crun in the guest)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  let sid: string;
  let sandboxConfig: Record<string, unknown>;
  let volume: string;

  const status_ = async (id: string) => (await rt.cri.runtime.ContainerStatus({ container_id: id })).status!;
  const create = async (name: string, extra: Record<string, unknown>) =>
    (
      await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: {
          metadata: { name, attempt: 0 },
          image: { image },
          log_path: `${name}.log`,
          mounts: [{ container_path: '/vol', host_path: volume }],
          ...extra,
        },
        sandbox_config: sandboxConfig,
      })
    ).container_id;
  const start = (id: string) => rt.cri.runtime.StartContainer({ container_id: id });
  const watchEvents = (into: Event[]) => {
    const stream = rt.cri.runtime.GetContainerEvents({});
    stream.on('data', (e: Event) => into.push(e));
    stream.on('error', () => undefined);
    return stream;
  };

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
    });
    await allowLoopbackRegistries(rt);
    volume = path.join(rt.dir, 'volume');
    await fsp.mkdir(volume);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    sandboxConfig = { ...podConfig(rt, 'crash'), hostname: 'crash-pod', log_directory: path.join(rt.dir, 'pod-logs') };
    sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
  });

  afterAll(async () => {
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it('exits while the daemon is down: exit code, finish time, reason, every log line once, events; tty output as stdout', async () => {
    const waitGo = 'while [ ! -e /vol/go ]; do sleep 0.1; done';
    const late = await create('late', {
      command: [
        'sh',
        '-c',
        `i=0; while [ $i -lt 50 ]; do echo before-$i; i=$((i+1)); done; echo err-before >&2; ${waitGo}; ` +
          'i=0; while [ $i -lt 50 ]; do echo down-$i; i=$((i+1)); done; echo err-down >&2; printf tail; touch /vol/late-done; exit 5',
      ],
    });
    const tty = await create('tty', {
      tty: true,
      command: ['sh', '-c', `echo tty-out; echo tty-err >&2; ${waitGo}; echo tty-down; touch /vol/tty-done; exit 0`],
    });
    const runner = await create('runner', { command: ['sh', '-c', `${waitGo}; while true; do sleep 1; done`] });
    for (const id of [late, tty, runner]) await start(id);
    const latePath = (await status_(late)).log_path;
    const ttyPath = (await status_(tty)).log_path;
    await until('the output before the crash', async () =>
      (await criLogLines(latePath)).length === 51 && (await criLogLines(ttyPath)).length === 2 ? true : undefined,
    );

    await rt.crash();
    const crashedAtNs = BigInt(Date.now()) * 1_000_000n;
    await fsp.writeFile(path.join(volume, 'go'), '');
    await until('both containers to finish while the daemon is down', async () =>
      (await exists(path.join(volume, 'late-done'))) && (await exists(path.join(volume, 'tty-done'))) ? true : undefined,
    );
    // The containers exit right after touching their file; give the guest a moment to reap them.
    await new Promise((r) => setTimeout(r, 2000));
    const restartedAtNs = BigInt(Date.now()) * 1_000_000n;
    await rt.start();
    const events: Event[] = [];
    const stream = watchEvents(events);
    try {
      const s = await until('late to be EXITED', async () => {
        const st = await status_(late);
        return st.state === 'CONTAINER_EXITED' ? st : undefined;
      });
      expect(s).toMatchObject({ exit_code: 5, reason: 'Error' });
      // The exit time is the guest's, from while the daemon was down, not the time it was learnt.
      expect(BigInt(s.finished_at)).toBeGreaterThan(crashedAtNs - 5_000_000_000n);
      expect(BigInt(s.finished_at)).toBeLessThan(restartedAtNs);
      expect(BigInt(s.finished_at)).toBeGreaterThanOrEqual(BigInt(s.started_at));

      const want = [
        ...Array.from({ length: 50 }, (_, i) => `stdout F before-${i}`),
        'stderr F err-before',
        ...Array.from({ length: 50 }, (_, i) => `stdout F down-${i}`),
        'stderr F err-down',
        'stdout P tail',
      ];
      await until('the whole late log', async () => ((await criLogLines(latePath)).length >= want.length ? true : undefined));
      // Stdout and stderr are separate pipes: only the order within each stream is defined.
      const lines = await criLogLines(latePath);
      expect(lines.filter((l) => l.startsWith('stdout'))).toEqual(want.filter((l) => l.startsWith('stdout')));
      expect(lines.filter((l) => l.startsWith('stderr'))).toEqual(want.filter((l) => l.startsWith('stderr')));

      const t = await until('tty to be EXITED', async () => {
        const st = await status_(tty);
        return st.state === 'CONTAINER_EXITED' ? st : undefined;
      });
      expect(t).toMatchObject({ exit_code: 0, reason: 'Completed' });
      await until('the whole tty log', async () => ((await criLogLines(ttyPath)).length >= 3 ? true : undefined));
      expect(await criLogLines(ttyPath)).toEqual(['stdout F tty-out', 'stdout F tty-err', 'stdout F tty-down']);

      // Events after the restart: the stops learnt on recovery, nothing about the running one.
      await until('the stopped events', async () =>
        [late, tty].every((id) => events.some((e) => e.container_id === id && e.container_event_type === 'CONTAINER_STOPPED_EVENT'))
          ? true
          : undefined,
      );
      expect(events.filter((e) => e.container_id === late && e.container_event_type === 'CONTAINER_STOPPED_EVENT')).toHaveLength(1);
      expect(events.some((e) => e.container_id === runner)).toBe(false);
      expect((await status_(runner)).state).toBe('CONTAINER_RUNNING');

      // The running one still answers and stops after the crash.
      await rt.cri.runtime.StopContainer({ container_id: runner, timeout: 1 });
      expect((await status_(runner)).state).toBe('CONTAINER_EXITED');
      for (const id of [late, tty, runner]) await rt.cri.runtime.RemoveContainer({ container_id: id });
    } finally {
      stream.cancel();
    }
  });

  it(
    'the agent in the guest is killed (SIGKILL) and restarted by the guest init: output is not lost or repeated, exec and stop work',
    async () => {
      // Each writes until the agent is killed, then a burst while the agent is down, then "end".
      const burst = (out: string, n: number) => `j=0; while [ $j -lt ${n} ]; do ${out}; i=$((i+1)); j=$((j+1)); done`;
      const ticker = await create('ticker', {
        command: [
          'sh',
          '-c',
          `i=0; while [ ! -e /vol/agent-killed ]; do echo tick-$i; echo tock-$i >&2; i=$((i+1)); sleep 0.2; done; ` +
            `${burst('echo tick-$i; echo tock-$i >&2', 50)}; echo end; sleep 1000`,
        ],
      });
      const ttyTicker = await create('tty-ticker', {
        tty: true,
        command: [
          'sh',
          '-c',
          `i=0; while [ ! -e /vol/agent-killed ]; do echo tty-$i; i=$((i+1)); sleep 0.2; done; ${burst('echo tty-$i', 30)}; echo tty-end; sleep 1000`,
        ],
      });
      // In the guest's root PID namespace (pid NODE): it sees the agent and kills it on a signal
      // file. The pattern is written so that it does not match this shell's own command line.
      const killer = await create('killer', {
        command: [
          'sh',
          '-c',
          'while [ ! -e /vol/kill-agent ]; do sleep 0.1; done; ' +
            'cd /proc; for p in [0-9]*; do if grep -q "kata-ts/agent[.]" $p/cmdline 2>/dev/null; then kill -9 $p; echo killed $p; break; fi; done; ' +
            'touch /vol/agent-killed; sleep 1000',
        ],
        linux: { security_context: { namespace_options: { pid: 'NODE' } } },
      });
      for (const id of [ticker, ttyTicker, killer]) await start(id);
      const tickerLog = (await status_(ticker)).log_path;
      const ttyLog = (await status_(ttyTicker)).log_path;
      await until('a few ticks', async () => ((await criLogLines(tickerLog)).length > 10 ? true : undefined));
      await fsp.writeFile(path.join(volume, 'kill-agent'), '');
      // Under TCG each grep is a fork and exec: walking /proc takes a while.
      await until('the agent to be killed', async () => exists(path.join(volume, 'agent-killed')), 180_000);
      const killerLog = (await status_(killer)).log_path;
      await until('the killer log', async () => ((await criLogLines(killerLog)).length > 0 ? true : undefined));
      expect((await criLogLines(killerLog))[0]).toMatch(/^stdout F killed \d+$/);

      const ended = async (file: string, last: string) => ((await criLogLines(file)).includes(last) ? true : undefined);
      await until('the ticker to end', () => ended(tickerLog, 'stdout F end'), 180_000);
      const lines = await criLogLines(tickerLog);
      const ticks = lines.filter((l) => l.startsWith('stdout') && l !== 'stdout F end');
      expect(ticks.length).toBeGreaterThan(50);
      expect(ticks).toEqual(Array.from({ length: ticks.length }, (_, i) => `stdout F tick-${i}`));
      expect(lines.filter((l) => l.startsWith('stderr'))).toEqual(Array.from({ length: ticks.length }, (_, i) => `stderr F tock-${i}`));
      await until('the tty ticker to end', () => ended(ttyLog, 'stdout F tty-end'), 120_000);
      const ttyLines = (await criLogLines(ttyLog)).filter((l) => l !== 'stdout F tty-end');
      expect(ttyLines.length).toBeGreaterThan(30);
      expect(ttyLines).toEqual(Array.from({ length: ttyLines.length }, (_, i) => `stdout F tty-${i}`));

      const exec = await rt.cri.runtime.ExecSync({
        container_id: ticker,
        cmd: ['echo', 'after the agent restart'],
        timeout: 30,
      });
      expect([exec.stdout.toString(), exec.exit_code]).toEqual(['after the agent restart\n', 0]);
      for (const id of [ticker, ttyTicker, killer]) {
        await rt.cri.runtime.StopContainer({ container_id: id, timeout: 1 });
        const st = await status_(id);
        // SIGTERM ends a shell that is not its PID namespace's init (143); otherwise SIGKILL (137).
        expect(st.state).toBe('CONTAINER_EXITED');
        expect([137, 143]).toContain(st.exit_code);
        await rt.cri.runtime.RemoveContainer({ container_id: id });
      }
    },
    scaledMs(400_000),
  );

  it('a CRI device is mapped to the guest node of the same path: linux.devices with the guest numbers, allowed by the device cgroup', async () => {
    const fuse = await create('fuse', {
      command: ['sleep', '100000'],
      devices: [{ host_path: '/dev/fuse', container_path: '/dev/fuse', permissions: 'rw' }],
    });
    const plain = await create('plain', { command: ['sleep', '100000'] });
    for (const id of [fuse, plain]) await start(id);
    const probe = 'stat -c %t:%T /dev/fuse; head -c 0 /dev/fuse && echo opened';
    const exec = (id: string, cmd: string) => rt.cri.runtime.ExecSync({ container_id: id, cmd: ['sh', '-c', cmd], timeout: 60 });
    // 10:229 is the misc major and fuse's minor in the guest kernel.
    expect((await exec(fuse, probe)).stdout.toString()).toBe('a:e5\nopened\n');
    // Without the device: no node, and one made by hand is refused by the device cgroup.
    expect((await exec(plain, 'mknod /tmp/f c 10 229 && head -c 0 /tmp/f && echo opened')).stdout.toString()).not.toContain('opened');
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
  });
});
