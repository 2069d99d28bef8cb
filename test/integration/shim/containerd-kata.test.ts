/**
 * kata-ts as a RuntimeClass handler behind the real containerd (Debian's 1.6.20, started
 * privately by test/helpers/containerd.ts): containerd execs `containerd-shim-kata-ts-v2` (the
 * repo's sources through tsx) for the `kata-ts` handler, beside runc pods on the same containerd.
 * One pod VM is booted: pull, RunPodSandbox, containers (output in containerd's CRI log through
 * our FIFOs, exit codes, stop), ExecSync, stats, a containerd restart under the running pod, then
 * the shim SIGKILLed (containerd hears the exit and its `delete` leaves nothing: no QEMU,
 * virtiofsd, mount, TAP, cgroup or file). No kata-ts daemon runs at any point.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER, mountPointsUnder } from '../../helpers/containerd.js';
import { until, untilLogLines } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`kata-ts behind containerd skipped: ${MISSING}`);

describe.skipIf(MISSING !== null)('kata-ts behind containerd 1.6.20 (the shim v2 handler), beside runc', () => {
  const node = new ShimNode('/tmp/ktk-');
  let image = '';
  let logDir = '';
  let podId = '';
  let runcPodId = '';
  let podIp = '';
  const podUid = randomUUID();
  const podUid2 = randomUUID();
  const parentOf = (uid: string) => `/kubepods/burstable/pod${uid}`;
  const sandboxConfig = (name = 'kata', uid = podUid): PodSandboxConfig => ({
    metadata: { name, uid, namespace: 'default', attempt: 0 },
    hostname: `${name}-pod`,
    log_directory: logDir,
    linux: { cgroup_parent: parentOf(uid) },
  });
  const containerStatus = async (id: string) => (await node.cri.runtime.ContainerStatus({ container_id: id })).status!;
  const runtimeMountinfo = () => node.ctrd.nodeExec(['nsenter', `--mount=${node.mountNamespacePath}`, '--', 'cat', '/proc/self/mountinfo']);
  const shimPids = () =>
    liveProcessesMentioning(`-id\u0000${podId}`).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('serve'));

  beforeAll(async () => {
    await node.start();
    image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'kata-shim', ['sleep', 'ip', 'hostname', 'cat', 'tail']);
    logDir = await node.podLogDir('kata', podUid);
    await node.cri.image.PullImage({ image: { image } });
  });

  afterAll(() => node.stop());

  it('RunPodSandbox with the kata-ts handler boots the pod VM in the pod network containerd made; a runc pod runs beside it', async () => {
    runcPodId = (await node.cri.runtime.RunPodSandbox({ config: sandboxConfig('plain', randomUUID()), runtime_handler: '' }))
      .pod_sandbox_id;
    podId = (
      await node.cri.runtime.RunPodSandbox(
        { config: sandboxConfig(), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    const { status } = await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId });
    expect(status?.state).toBe('SANDBOX_READY');
    podIp = status?.network?.ip ?? '';
    expect(podIp.startsWith(node.ctrd.podSubnetPrefix)).toBe(true);
    // One shim process for the pod, serving it; QEMU runs under the pod's cgroup parent.
    expect(shimPids()).toHaveLength(1);
    const podDirs = await fsp.readdir(path.join(node.stateRoot, 'k8s.io'));
    expect(podDirs).toEqual([podId.slice(0, 16)]);
    const qemu = liveProcessesMentioning(path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16))).filter((p) =>
      readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'),
    );
    expect(qemu).toHaveLength(1);
    // The shim runs in the runtime's mount namespace, not in the node's; its QEMU in one of its own
    // (pivot_rooted into its jail), made from the runtime's.
    const mntns = (pid: number) => readlinkSync(`/proc/${pid}/ns/mnt`);
    expect(mntns(shimPids()[0]!)).not.toBe(mntns(node.ctrd.nodePid));
    expect([mntns(shimPids()[0]!), mntns(node.ctrd.nodePid)]).not.toContain(mntns(qemu[0]!));
    const cgroup = readFileSync(`/proc/${qemu[0]}/cgroup`, 'utf8');
    expect(cgroup).toContain(`/pod${podUid}/`);
    expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: runcPodId })).status?.state).toBe('SANDBOX_READY');
  });

  let appId = '';
  it("a container: its stdout and stderr reach containerd's CRI log through the FIFOs; ExecSync; stats", async () => {
    appId = (
      await node.cri.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: {
          metadata: { name: 'app', attempt: 0 },
          image: { image },
          command: [
            'sh',
            '-c',
            "trap 'echo got TERM; exit 42' TERM; echo hello from the VM; echo to stderr >&2; while :; do sleep 1 & wait $!; done",
          ],
          log_path: 'app.log',
          linux: { resources: { memory_limit_in_bytes: String(64 * 1024 * 1024) } },
        },
        sandbox_config: sandboxConfig(),
      })
    ).container_id;
    await node.cri.runtime.StartContainer({ container_id: appId });
    expect((await containerStatus(appId)).state).toBe('CONTAINER_RUNNING');
    await untilLogLines(
      'the container output in the CRI log',
      [path.join(logDir, 'app.log')],
      (l) => l.includes('stdout F hello from the VM') && l.includes('stderr F to stderr'),
    );
    const res = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['sh', '-c', 'echo out; echo err >&2; exit 3'], timeout: 60 });
    expect([res.stdout.toString(), res.stderr.toString(), res.exit_code]).toEqual(['out\n', 'err\n', 3]);
    const ip = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['ip', '-4', '-o', 'addr'], timeout: 60 });
    expect(ip.stdout.toString()).toContain(`inet ${podIp}/`);
    const hostname = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['hostname'], timeout: 60 });
    expect(hostname.stdout.toString().trim()).toBe('kata-pod');
    await until('cpu and memory in ContainerStats', async (note) => {
      const { stats } = await node.cri.runtime.ContainerStats({ container_id: appId });
      note(stats);
      const cpu = BigInt(stats?.cpu?.usage_core_nano_seconds?.value ?? '0');
      const memory = BigInt(stats?.memory?.working_set_bytes?.value ?? '0');
      return cpu > 0n && memory > 0n ? true : undefined;
    });
  });

  it('a container that exits on its own: its exit code and last output', async () => {
    const id = (
      await node.cri.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: {
          metadata: { name: 'exits', attempt: 0 },
          image: { image },
          command: ['sh', '-c', 'echo bye; exit 7'],
          log_path: 'exits.log',
        },
        sandbox_config: sandboxConfig(),
      })
    ).container_id;
    await node.cri.runtime.StartContainer({ container_id: id });
    const status = await until('the container to exit', async (note) => {
      const s = await containerStatus(id);
      note(s.state);
      return s.state === 'CONTAINER_EXITED' ? s : undefined;
    });
    expect(status).toMatchObject({ exit_code: 7, reason: 'Error' });
    await untilLogLines('its output', [path.join(logDir, 'exits.log')], (l) => l.includes('stdout F bye'));
    await node.cri.runtime.RemoveContainer({ container_id: id });
  });

  it('a containerd restart leaves the pod and its shim running; the new containerd drives them', async () => {
    const [shim] = shimPids();
    await node.ctrd.restart();
    expect(isRunning(shim!)).toBe(true);
    expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_READY');
    expect((await containerStatus(appId)).state).toBe('CONTAINER_RUNNING');
    const res = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['echo', 'after restart'], timeout: 60 });
    expect([res.stdout.toString(), res.exit_code]).toEqual(['after restart\n', 0]);
  });

  /** One exec through containerd's streaming server, by a client run inside the node's network namespace. */
  const streamExec = async (cmd: string[], tty: boolean, options: Record<string, unknown>) => {
    const { url } = await node.cri.runtime.Exec({ container_id: appId, cmd, tty, stdin: 'stdin' in options, stdout: true, stderr: !tty });
    const out = await node.ctrd.nodeExec(
      [
        process.execPath,
        '--import',
        // tsx by path: the child runs with the node's cwd, outside the repository.
        pathToFileURL(path.join(packageRoot(), 'node_modules', 'tsx', 'dist', 'loader.mjs')).href,
        path.join(packageRoot(), 'test', 'helpers', 'spdy-command-child.ts'),
        url,
        JSON.stringify({ tty, ...options }),
      ],
      120_000,
    );
    return JSON.parse(out) as { stdout: string; stderr: string; status: string };
  };

  it("exec -t through containerd's streaming server: the terminal's size (ResizePty) and the exit code", async () => {
    // containerd sends the size (ResizePty) once Start has answered, after the process started:
    // the process waits for its terminal to have one, as a shell would on SIGWINCH.
    // (fd 3: the terminal, since inside $(...) fd 1 is the pipe; busybox stty prints nothing for a 0x0 terminal.)
    const waitForSize =
      'exec 3<&1; until s=$(stty size <&3 2>/dev/null) && [ -n "$s" ] && [ "$s" != "0 0" ]; do sleep 0.1; done; echo "$s"; exit 4';
    const result = await streamExec(['sh', '-c', waitForSize], true, { stderr: false, resize: { Width: 91, Height: 17 } });
    expect(result.stdout).toContain('17 91');
    expect(result.status).toContain('exit code 4');
  });

  it('exec -i: stdin through the FIFO, closed at its end (CloseIO); stdout and stderr apart', async () => {
    const result = await streamExec(['sh', '-c', 'read line; echo got $line; echo oops >&2; exit 5'], false, { stdin: 'hello\n' });
    expect([result.stdout, result.stderr]).toEqual(['got hello\n', 'oops\n']);
    expect(result.status).toContain('exit code 5');
  });

  it("UpdateContainerResources reaches the task (Update) and the container's own cgroup in the guest, raised and lowered; it keeps running", async () => {
    // What the container reads of its own limits, in its cgroup (the exec joins it).
    const limits = async () => {
      // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell parameter expansion, not a template
      const cmd = 'read l < /proc/self/cgroup; d=/sys/fs/cgroup${l#0::}; cat $d/memory.max $d/cpu.max';
      const r = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['sh', '-c', cmd], timeout: 60 });
      return r.stdout.toString().trim().split('\n');
    };
    expect(await limits()).toEqual([String(64 * 1024 * 1024), 'max 100000']);
    await node.cri.runtime.UpdateContainerResources({
      container_id: appId,
      linux: { memory_limit_in_bytes: String(96 * 1024 * 1024), cpu_period: '100000', cpu_quota: '50000' },
    });
    expect(await limits()).toEqual([String(96 * 1024 * 1024), '50000 100000']);
    await node.cri.runtime.UpdateContainerResources({
      container_id: appId,
      linux: { memory_limit_in_bytes: String(80 * 1024 * 1024), cpu_period: '100000', cpu_quota: '25000' },
    });
    expect(await limits()).toEqual([String(80 * 1024 * 1024), '25000 100000']);
    expect((await containerStatus(appId)).state).toBe('CONTAINER_RUNNING');
    // Beyond what the VM can grow to, the core's refusal comes back through containerd, naming memory.
    const refused = await node.cri.runtime
      .UpdateContainerResources({ container_id: appId, linux: { memory_limit_in_bytes: String(1024 * 1024 * 1024 * 1024) } })
      .then(
        () => undefined,
        (err: { details?: string }) => err.details ?? String(err),
      );
    expect(refused).toMatch(/memory/i);
    expect((await containerStatus(appId)).state).toBe('CONTAINER_RUNNING');
  });

  it("an OOM kill of a process other than the container's init: containerd hears TaskOOM while the container runs", async () => {
    // The exec joins the container's cgroup (64 MiB): the OOM killer ends it, the init lives on.
    const hog = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['tail', '/dev/zero'], timeout: 120 });
    expect(hog.exit_code).toBe(137);
    // containerd's CRI sets the reason when it hears TaskOOM, whatever the container's state.
    await until('containerd to hear the OOM kill', async (note) => {
      const s = await containerStatus(appId);
      note({ state: s.state, reason: s.reason });
      return s.reason === 'OOMKilled' ? s : undefined;
    });
    expect((await containerStatus(appId)).state).toBe('CONTAINER_RUNNING');
  });

  it('StopContainer: SIGTERM and its exit code; RemoveContainer', async () => {
    await node.cri.runtime.StopContainer({ container_id: appId, timeout: 30 });
    expect(await containerStatus(appId)).toMatchObject({ state: 'CONTAINER_EXITED', exit_code: 42 });
    await untilLogLines('the trap output', [path.join(logDir, 'app.log')], (l) => l.includes('stdout F got TERM'));
    await node.cri.runtime.RemoveContainer({ container_id: appId });
  });

  // critest sends a `/test.slice` parent whatever the node runs, and containerd 1.6 turns any
  // `.slice` parent into runc's systemd form `test.slice:cri-containerd:<id>`. With the default
  // `cgroupDriver: auto` on a host that runs no systemd the pod must be placed with cgroupfs, as runc
  // places its own; it used to take the path's form for the driver and fail on an absent D-Bus.
  it.skipIf(existsSync('/run/systemd/system'))(
    "a pod whose parent is a systemd slice, on a host without systemd: 'auto' places it with cgroupfs (no D-Bus asked)",
    async () => {
      const uid = randomUUID();
      const sliced = (
        await node.cri.runtime.RunPodSandbox(
          { config: { ...sandboxConfig('sliced', uid), linux: { cgroup_parent: '/test.slice' } }, runtime_handler: KATA_TS_HANDLER },
          { deadline: Date.now() + scaledMs(240_000) },
        )
      ).pod_sandbox_id;
      try {
        expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sliced })).status?.state).toBe('SANDBOX_READY');
        const podDir = path.join(node.stateRoot, 'k8s.io', sliced.slice(0, 16));
        const [qemu] = liveProcessesMentioning(podDir).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
        // The slice is dropped under cgroupfs: the VMM goes to the root's kata-ts-<id>.
        expect(readFileSync(`/proc/${qemu}/cgroup`, 'utf8')).toContain(`/kata-ts-${sliced}`);
      } finally {
        await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: sliced });
        await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sliced });
      }
    },
  );

  it('StopPodSandbox, RemovePodSandbox: the shim exits once its last task is gone, leaving no process, mount, cgroup or file', async () => {
    const [shim] = shimPids();
    const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_NOTREADY');
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    await until('the shim to exit (Shutdown with no task left)', async (note) => {
      note(isRunning(shim!));
      return isRunning(shim!) ? undefined : true;
    });
    expect(liveProcessesMentioning(podDir)).toEqual([]);
    expect(existsSync(podDir)).toBe(false);
    expect(await fsp.readdir(path.join(node.stateRoot, 's'))).toEqual([]);
    // The shims' mounts were made in the runtime's mount namespace, never in the node's.
    expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
    expect(mountPointsUnder(await runtimeMountinfo(), podDir)).toEqual([]);
    for (const d of node.ctrd.cgroupDirs(parentOf(podUid2))) {
      const children = (await fsp.readdir(d, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory()).map((e) => e.name);
      expect(children, d).toEqual([]);
    }
  });

  it('the shim SIGKILLed: containerd hears the pod end, and its delete leaves no QEMU, mount, cgroup or file', async () => {
    podId = (
      await node.cri.runtime.RunPodSandbox(
        { config: sandboxConfig('doomed', podUid2), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    const [shim] = shimPids();
    const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
    process.kill(shim!, 'SIGKILL');
    await until('containerd to see the sandbox NOTREADY', async (note) => {
      const s = (await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state;
      note(s);
      return s === 'SANDBOX_NOTREADY' ? true : undefined;
    });
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    await until('no process of the pod', async (note) => {
      const left = liveProcessesMentioning(podDir);
      note(left);
      return left.length === 0 ? true : undefined;
    });
    // containerd runs the shim's `delete` in the background once it saw the shim die.
    await until('the pod state removed by delete', async (note) => {
      note(existsSync(podDir) ? readdirSync(podDir) : 'gone');
      return existsSync(podDir) ? undefined : true;
    });
    expect(await node.ctrd.mountsUnder(podDir)).toEqual([]);
    expect(mountPointsUnder(await runtimeMountinfo(), podDir)).toEqual([]);
    for (const d of node.ctrd.cgroupDirs(parentOf(podUid2))) {
      const children = (await fsp.readdir(d, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory()).map((e) => e.name);
      expect(
        children.filter((c) => c.includes(podId.slice(0, 16))),
        d,
      ).toEqual([]);
    }
    // The runc pod was never disturbed.
    expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: runcPodId })).status?.state).toBe('SANDBOX_READY');
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: runcPodId });
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: runcPodId });
  });
});
