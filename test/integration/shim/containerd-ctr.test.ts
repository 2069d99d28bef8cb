/**
 * kata-ts's shim in single-container mode behind the real containerd (Debian's 1.6.20, started
 * privately by test/helpers/containerd.ts), driven by containerd's own `ctr` on its socket:
 * `ctr run --runtime io.containerd.kata-ts.v2` hands the shim a bundle without CRI annotations,
 * which becomes a pod VM of its own, sized from the container's `--cpus` and `--memory-limit`.
 * Two VMs are booted:
 *
 * 1. `ctr run -d --log-uri file:///...`: the output lands in the file; exec, pause and resume act
 *    on the container; `ctr task kill` ends it with its SIGTERM trap; `ctr task rm` and `ctr
 *    container rm` leave no QEMU, shim, mount, cgroup or state.
 * 2. `ctr run --log-uri binary:///<logger>?out=...`: a shell-script logger (containerd's logging
 *    protocol: fd 3, 4, ready fd 5, CONTAINER_ID and CONTAINER_NAMESPACE) receives stdout and
 *    stderr; `ctr run` exits with the container's exit code; the logger is gone afterwards.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins, ctr) is not installed.
 */
import { execFile } from 'node:child_process';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, mountPointsUnder } from '../../helpers/containerd.js';
import { until } from '../../helpers/poll.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const MISSING = containerdMissing() ?? (existsSync('/usr/bin/ctr') ? null : 'ctr is not installed (Debian containerd ships it)');
if (MISSING !== null) console.warn(`kata-ts single-container mode through ctr skipped: ${MISSING}`);

/** A containerd namespace of the test's own (the CRI plugin's is k8s.io). */
const NS = 'solo-test';
const RUNTIME = 'io.containerd.kata-ts.v2';

interface CtrResult {
  code: number;
  stdout: string;
  stderr: string;
}

describe.skipIf(MISSING !== null)('single-container mode: ctr run with the kata-ts runtime behind containerd 1.6.20', () => {
  const node = new ShimNode('/tmp/ktc-');
  let image = '';

  /** `ctr` on the private containerd's socket, run inside the harness's node; never rejects on an exit code. */
  const ctr = (args: string[], timeoutMs = 60_000): Promise<CtrResult> =>
    new Promise((resolve, reject) => {
      execFile(
        'nsenter',
        [`--target=${node.ctrd.nodePid}`, '--mount', '--net', '--', 'ctr', '--address', node.ctrd.grpcAddress, '-n', NS, ...args],
        { timeout: scaledMs(timeoutMs) },
        (err, stdout, stderr) => {
          const code =
            err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code as number) : -1;
          if (code === -1) reject(new Error(`ctr ${args.join(' ')}: ${err?.message} ${stderr}`));
          else resolve({ code, stdout, stderr });
        },
      );
    });
  const ok = async (args: string[], timeoutMs?: number): Promise<string> => {
    const r = await ctr(args, timeoutMs);
    if (r.code !== 0) throw new Error(`ctr ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
    return r.stdout;
  };
  const podDir = (id: string) => path.join(node.stateRoot, NS, id.slice(0, 16));
  const qemuOf = (id: string) =>
    liveProcessesMentioning(podDir(id)).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
  const taskLine = async (id: string) => (await ok(['task', 'ls'])).split('\n').find((l) => l.startsWith(`${id} `)) ?? '';
  const runtimeMountinfo = () => node.ctrd.nodeExec(['nsenter', `--mount=${node.mountNamespacePath}`, '--', 'cat', '/proc/self/mountinfo']);

  /** Nothing of the pod is left: no QEMU or shim, no state dir, no mount in either namespace, no cgroup of it. */
  const expectNothingLeft = async (id: string) => {
    await until(`no process of ${id}`, async (note) => {
      const left = [...liveProcessesMentioning(podDir(id)), ...liveProcessesMentioning(`-id\u0000${id}\u0000`)];
      note(left);
      return left.length === 0 ? true : undefined;
    });
    await until(`the state of ${id} removed`, async (note) => {
      note(existsSync(podDir(id)));
      return existsSync(podDir(id)) ? undefined : true;
    });
    expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
    expect(mountPointsUnder(await runtimeMountinfo(), podDir(id))).toEqual([]);
    expect(await node.ctrd.mountsUnder(node.ctrd.bundleDir(id))).toEqual([]);
    const cgroups = (await node.ctrd.podCgroups()).filter((c) => c.includes(id));
    expect(cgroups).toEqual([]);
  };

  beforeAll(async () => {
    await node.start();
    image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'solo', ['sleep', 'nproc']);
    await ok(['image', 'pull', '--plain-http', image], 120_000);
  });

  afterAll(async () => {
    // A failed test's tasks and containers go first (the VMs with them), then the node.
    if (node.dir !== '') {
      for (const id of ['solo-big', 'solo-file', 'solo-binary']) {
        await ctr(['task', 'kill', '-s', 'SIGKILL', id]).catch(() => undefined);
        await ctr(['task', 'rm', '-f', id], 120_000).catch(() => undefined);
        await ctr(['container', 'rm', id]).catch(() => undefined);
      }
    }
    await node.stop();
  });

  it('ctr run -d --log-uri file://: a VM of its own sized from --cpus/--memory-limit (too big: refused, nothing left); output in the file; exec, pause, kill, rm leave nothing', async () => {
    const id = 'solo-file';
    const logFile = path.join(node.dir, 'logs', 'solo-file.log');
    const script = "trap 'echo got TERM; exit 42' TERM; echo hello file; echo err line >&2; while :; do sleep 1 & wait $!; done";
    const run = (name: string, cpus: string) =>
      ctr(
        [
          'run',
          '-d',
          '--runtime',
          RUNTIME,
          '--cpus',
          cpus,
          '--memory-limit',
          String(384 * 1024 * 1024),
          '--log-uri',
          `file://${logFile}`,
        ].concat([image, name, 'sh', '-c', script]),
        240_000,
      );
    // Sized from the container's own limits by the planner: 2 CPUs + the guest's overhead do not
    // fit this 2-CPU host, refused before anything is made (the shim and its state go again).
    const big = await run('solo-big', '2');
    expect(big.code).not.toBe(0);
    expect(big.stderr).toMatch(/needs 3 vCPUs \(2000m workload/);
    await ok(['container', 'rm', 'solo-big']);
    await expectNothingLeft('solo-big');
    // 1 CPU: 1000m + the guest's 250m overhead are 2 vCPUs.
    const started = await run(id, '1');
    expect(started.code, started.stderr).toBe(0);
    await until('the output in the file', async (note) => {
      const text = existsSync(logFile) ? readFileSync(logFile, 'utf8') : '';
      note(text);
      return text.includes('hello file\n') && text.includes('err line\n') ? true : undefined;
    });
    // One QEMU for the task, whose pid is the task's; the VM planned from the container's limits.
    const [qemu] = qemuOf(id);
    expect(qemu).toBeDefined();
    expect(await taskLine(id)).toMatch(new RegExp(`^${id}\\s+${qemu}\\s+RUNNING`));
    const argv = readFileSync(`/proc/${qemu}/cmdline`, 'utf8').split('\u0000');
    const memMiB = Number(/(?:^|,)size=(\d+)M/.exec(argv[argv.indexOf('-m') + 1] ?? '')?.[1]);
    // 384 MiB limit + the handler's 160 MiB guest overhead (its default without limits: 1 vCPU, 512 MiB).
    expect(memMiB).toBeGreaterThanOrEqual(384 + 160);
    expect(argv[argv.indexOf('-smp') + 1]).toMatch(/^cpus=2,/);
    // An exec runs in the container, in the VM: the guest has the two vCPUs.
    expect((await ok(['task', 'exec', '--exec-id', 'e1', id, 'nproc'])).trim()).toBe('2');
    // Stats and Pids answer for the container: its guest cgroup's numbers, the VMM's pid.
    await until('memory and CPU in ctr task metrics', async (note) => {
      const metrics = await ok(['task', 'metrics', id]);
      note(metrics);
      return /memory\.usage_in_bytes\s+[1-9]/.test(metrics) && /cpuacct\.usage\s+[1-9]/.test(metrics) ? true : undefined;
    });
    expect(
      (await ok(['task', 'ps', id]))
        .split('\n')
        .slice(1)
        .filter((l) => l.trim() !== '')
        .map((l) => l.trim().split(/\s+/)[0]),
    ).toEqual([String(qemu)]);
    await ok(['task', 'pause', id]);
    expect(await taskLine(id)).toMatch(/\sPAUSED/);
    await ok(['task', 'resume', id]);
    expect(await taskLine(id)).toMatch(/\sRUNNING/);
    // SIGTERM reaches the container's process: its trap writes and exits; the VM stays until rm.
    await ok(['task', 'kill', id]);
    await until('the task to stop', async (note) => {
      const line = await taskLine(id);
      note(line);
      return /\sSTOPPED/.test(line) ? true : undefined;
    });
    expect(readFileSync(logFile, 'utf8')).toContain('got TERM\n');
    expect(qemuOf(id)).toHaveLength(1);
    await ok(['task', 'rm', id], 120_000);
    await ok(['container', 'rm', id]);
    await expectNothingLeft(id);
  });

  it('ctr run --log-uri binary://: the logging binary gets stdout on fd 3, stderr on fd 4, its env; ctr exits with the exit code; nothing is left', async () => {
    const id = 'solo-binary';
    const logger = path.join(node.dir, 'logger.sh');
    const out = path.join(node.dir, 'binary');
    // containerd gives the logger no PATH: absolute paths only. Its children must not hold fd 5.
    await fsp.writeFile(
      logger,
      [
        '#!/bin/sh',
        'printf "id=%s ns=%s args=%s\\n" "$CONTAINER_ID" "$CONTAINER_NAMESPACE" "$*" > "$2.env"',
        '/bin/cat <&3 > "$2.out" 5>&- &',
        '/bin/cat <&4 > "$2.err" 5>&- &',
        'exec 5>&-',
        'wait',
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    const r = await ctr(
      [
        'run',
        '--runtime',
        RUNTIME,
        '--log-uri',
        `binary://${logger}?out=${out}`,
        image,
        id,
        'sh',
        '-c',
        'echo hello binary; echo to stderr >&2; exit 7',
      ],
      240_000,
    );
    expect(r.code, r.stderr).toBe(7);
    expect(readFileSync(`${out}.env`, 'utf8')).toBe(`id=${id} ns=${NS} args=out ${out}\n`);
    await until("the logger's files", async (note) => {
      const got = [`${out}.out`, `${out}.err`].map((f) => (existsSync(f) ? readFileSync(f, 'utf8') : ''));
      note(got);
      return got[0] === 'hello binary\n' && got[1] === 'to stderr\n' ? true : undefined;
    });
    // ctr run deleted the task (the VM with it); the logger ended with it.
    expect(liveProcessesMentioning(logger)).toEqual([]);
    await ok(['container', 'rm', id]);
    await expectNothingLeft(id);
  });
});
