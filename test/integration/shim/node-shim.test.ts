/**
 * The node shim (shim.mode "node", docs/shim.md "Shim modes") behind a real containerd (sid's
 * 2.1.9 when it can be fetched, else Debian 12's 1.6 on PATH): one node server process hosts
 * every pod, containerd talks to one relay per pod (native/shim-relay.c).
 *
 * 1. Two kata-ts pods with a container each: one node server process, two relays (each charged
 *    to its pod's VMM cgroup), two QEMUs.
 *    Each container's output FIFOs are held by a `kata-ts-shim-relay --hold` of its own
 *    (src/shim/node-output-holder.ts).
 * 2. `kill -9` of the node server: the relays revive it (a new pid), the QEMU pids are the same,
 *    containerd published no TaskExit (its event stream, read with the release's own `ctr
 *    events`), and ExecSync and StopContainer (the container's SIGTERM trap and exit code) work
 *    in each pod afterwards; the trap's output, written after the crash, reaches the CRI log
 *    (containerd's copy did not stop at the dead server's end of the FIFOs).
 * 3. Both pods stopped and removed: the relays, the holders and the node server exit (the server
 *    after its idle time), and no process, socket or pod state dir is left.
 *
 * Four QEMU boots at most (two pods); everything the test started is ended in afterAll, also
 * when a step failed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { HOLD_FLAG } from '../../../src/shim/node-output-holder.js';
import { RELAY_BINARY_NAME } from '../../../src/shim/node-relay.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { type ContainerdRelease, containerdRelease } from '../../helpers/containerd-releases.js';
import { until, untilLogLines } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const missing = containerdMissing();
const relayBuilt = existsSync(path.join(process.cwd(), 'dist', 'native', RELAY_BINARY_NAME));

function cmdline(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').slice(0, -1);
  } catch {
    return [];
  }
}

let release: ContainerdRelease | null = null;
let releaseNote = '';
if (missing === null) {
  const r21 = await containerdRelease('2.1');
  if (r21.release !== null) release = r21.release;
  else {
    releaseNote = `2.1 not available (${r21.missing}); through 1.6`;
    const r16 = await containerdRelease('1.6');
    release = r16.release;
    if (r16.release === null) releaseNote += `; 1.6 not available either (${r16.missing})`;
  }
}

describe.skipIf(missing !== null || !relayBuilt || release === null)('the node shim through containerd', () => {
  const node = new ShimNode('/tmp/ktns-');
  let image = '';
  const uids = [randomUUID(), randomUUID()];
  const pods: string[] = [];
  const apps: string[] = [];
  const logDirs: string[] = [];
  const qemuPids: number[] = [];
  let events: ChildProcess | undefined;
  let eventText = '';
  const parentOf = (uid: string) => `/kubepods/burstable/pod${uid}`;
  const sandboxConfig = (i: number): PodSandboxConfig => ({
    metadata: { name: `node-shim-${i}`, uid: uids[i]!, namespace: 'default', attempt: 0 },
    hostname: `pod-${i}`,
    log_directory: logDirs[i] ?? '',
    linux: { cgroup_parent: parentOf(uids[i]!) },
  });
  const podDir = (i: number) => path.join(node.stateRoot, 'k8s.io', pods[i]!.slice(0, 16));
  /** The node server processes of this test's containerd (their command line ends with node-serve). */
  const nodeServers = () =>
    liveProcessesMentioning(node.ctrd.grpcAddress).filter((p) => {
      const argv = cmdline(p);
      // A relay's command line ends with its revive command (flock's too): the node server is the node process.
      return argv.at(-1) === 'node-serve' && argv[0] === process.execPath;
    });
  const relays = () => liveProcessesMentioning(node.stateRoot).filter((p) => path.basename(cmdline(p)[0] ?? '') === RELAY_BINARY_NAME);
  /** The output holders of this test's containers (`kata-ts-shim-relay --hold <container id>`). */
  const holders = () =>
    liveProcessesMentioning(HOLD_FLAG).filter((p) => {
      const argv = cmdline(p);
      return path.basename(argv[0] ?? '') === RELAY_BINARY_NAME && argv[1] === HOLD_FLAG && apps.includes(argv[2] ?? '');
    });
  /** The TaskExit events of tasks (an exec's exit names its exec id as `id`: those are not a task's end). */
  const taskExits = (text: string): Array<{ container_id: string }> =>
    text
      .split('\n')
      .filter((l) => l.includes(' /tasks/exit '))
      .map((l) => JSON.parse(l.slice(l.indexOf('{'))) as { container_id: string; id: string })
      .filter((e) => e.id === e.container_id);
  /** A CRI call's deadline: boots, execs and stops on a loaded two-core machine take minutes. */
  const slow = () => ({ deadline: Date.now() + scaledMs(600_000) });
  const qemuOf = (i: number) =>
    liveProcessesMentioning(podDir(i)).filter((p) => path.basename(cmdline(p)[0] ?? '').startsWith('qemu-system'));

  beforeAll(async () => {
    if (releaseNote !== '') process.stderr.write(`node-shim.test: ${releaseNote}\n`);
    await node.start({
      shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(480_000) } },
      containerd: { ...(release!.label === '1.6' ? {} : { release: release! }) },
    });
    // shim.mode: node (the state root is known only now: the config file is rewritten before any pod).
    const configPath = path.join(node.dir, 'kata-ts.json');
    const config = JSON.parse(await fsp.readFile(configPath, 'utf8')) as { shim: Record<string, unknown> };
    config.shim.mode = 'node';
    await fsp.writeFile(configPath, JSON.stringify(config));
    image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'node-shim', ['sleep', 'cat']);
    await node.cri.image.PullImage({ image: { image } });
    for (let i = 0; i < 2; i++) logDirs.push(await node.podLogDir(`node-shim-${i}`, uids[i]!));
    // containerd's own event stream, for the whole test: a TaskExit is what would lose a pod.
    const ctr = release!.binDir === null ? 'ctr' : path.join(release!.binDir, 'ctr');
    events = spawn(ctr, ['--address', node.ctrd.grpcAddress, 'events'], { stdio: ['ignore', 'pipe', 'inherit'] });
    events.stdout!.setEncoding('utf8');
    events.stdout!.on('data', (chunk: string) => {
      eventText += chunk;
    });
  }, scaledMs(300_000));

  afterAll(async () => {
    events?.kill('SIGKILL');
    // A failed test's relays first: none may revive the node server while the pods go.
    if (node.dir !== '') for (const pid of relays()) process.kill(pid, 'SIGTERM');
    for (const id of pods) {
      await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
      await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
    }
    // A failed test's relays and node server (they name the state root or containerd's socket).
    if (node.dir !== '') for (const pid of [...relays(), ...nodeServers(), ...holders()]) process.kill(pid, 'SIGKILL');
    await node.stop();
  }, scaledMs(900_000));

  it('two kata-ts pods with a container each: one node server, two relays charged to their pods, two VMs', {
    timeout: scaledMs(1_200_000),
  }, async () => {
    for (let i = 0; i < 2; i++) {
      pods.push(
        (
          await node.cri.runtime.RunPodSandbox(
            { config: sandboxConfig(i), runtime_handler: KATA_TS_HANDLER },
            { deadline: Date.now() + scaledMs(600_000) },
          )
        ).pod_sandbox_id,
      );
      apps.push(
        (
          await node.cri.runtime.CreateContainer(
            {
              pod_sandbox_id: pods[i]!,
              config: {
                metadata: { name: 'app', attempt: 0 },
                image: { image },
                command: ['sh', '-c', "trap 'echo got TERM; exit 42' TERM; echo started; while :; do sleep 1 & wait $!; done"],
                log_path: 'app.log',
              },
              sandbox_config: sandboxConfig(i),
            },
            slow(),
          )
        ).container_id,
      );
      await node.cri.runtime.StartContainer({ container_id: apps[i]! }, slow());
      await untilLogLines('the container output', [path.join(logDirs[i]!, 'app.log')], (l) =>
        l.some((x) => x.includes('stdout F started')),
      );
    }
    expect(nodeServers()).toHaveLength(1);
    expect(relays()).toHaveLength(2);
    expect(holders()).toHaveLength(2);
    for (let i = 0; i < 2; i++) {
      const qemu = qemuOf(i);
      expect(qemu).toHaveLength(1);
      qemuPids.push(qemu[0]!);
      // The relay is the pod's own shim process: in the cgroup kata-ts placed the pod's VMM in.
      const relayPid = Number((await fsp.readFile(path.join(podDir(i), 'relay.pid'), 'utf8')).trim());
      expect(relays()).toContain(relayPid);
      await until("the relay in its pod's VMM cgroup", async (note) => {
        // The memory hierarchy is what charges it (v1 here; the unified line on a cgroup2 host).
        const memory = (pid: number) =>
          readFileSync(`/proc/${pid}/cgroup`, 'utf8')
            .split('\n')
            .filter((l) => /^[0-9]+:memory:/.test(l) || l.startsWith('0::'));
        const relay = memory(relayPid).join('\n');
        const vmm = memory(qemuPids[i]!).join('\n');
        note({ relay, vmm });
        return relay === vmm ? true : undefined;
      });
    }
  });

  it('kill -9 of the node server: the relays revive it, the VMs keep running, no TaskExit, exec and stop work', {
    timeout: scaledMs(600_000),
  }, async () => {
    const [server] = nodeServers();
    expect(server).toBeDefined();
    const seenBefore = eventText.length;
    process.kill(server!, 'SIGKILL');
    await until('the node server gone', async () => (isRunning(server!) ? undefined : true));
    // The next call through a relay revives it; the relays also notice the upstream closing.
    for (let i = 0; i < 2; i++) {
      const res = await node.cri.runtime.ExecSync(
        { container_id: apps[i]!, cmd: ['cat', '/proc/sys/kernel/hostname'], timeout: 600 },
        slow(),
      );
      expect([res.stdout.toString().trim(), res.exit_code]).toEqual([`pod-${i}`, 0]);
    }
    const revived = nodeServers();
    expect(revived).toHaveLength(1);
    expect(revived[0]).not.toBe(server);
    expect(relays()).toHaveLength(2);
    // The holders outlived the server: containerd's copy of each container's output goes on.
    expect(holders()).toHaveLength(2);
    for (let i = 0; i < 2; i++) expect(qemuOf(i)).toEqual([qemuPids[i]]);
    const status = await node.cri.runtime.ListPodSandbox({});
    expect(status.items.filter((p) => pods.includes(p.id)).map((p) => p.state)).toEqual(['SANDBOX_READY', 'SANDBOX_READY']);
    // containerd heard no task end while the server was down and came back.
    expect(taskExits(eventText.slice(seenBefore))).toEqual([]);
    for (let i = 0; i < 2; i++) {
      await node.cri.runtime.StopContainer({ container_id: apps[i]!, timeout: 30 }, slow());
      const st = (await node.cri.runtime.ContainerStatus({ container_id: apps[i]! })).status!;
      expect([st.state, st.exit_code]).toEqual(['CONTAINER_EXITED', 42]);
      await untilLogLines(
        'the trap output',
        [path.join(logDirs[i]!, 'app.log')],
        (l) => l.some((x) => x.includes('stdout F got TERM')),
        scaledMs(300_000),
      );
    }
    // Now the containers' exits, and only theirs: the sandboxes' tasks still run.
    const exits = await until("the two containers' TaskExit events", async (note) => {
      const seen = taskExits(eventText.slice(seenBefore));
      note(seen);
      return seen.length >= 2 ? seen : undefined;
    });
    expect(exits.map((e) => e.container_id).sort()).toEqual([...apps].sort());
    // Released before each exit was told (containerd's Delete waits for its copy to end).
    expect(holders()).toEqual([]);
    for (let i = 0; i < 2; i++) expect(qemuOf(i)).toEqual([qemuPids[i]]);
  });

  it('both pods stopped and removed: the relays and the node server exit, nothing is left', { timeout: scaledMs(600_000) }, async () => {
    const server = nodeServers()[0]!;
    const dirs = [podDir(0), podDir(1)];
    for (const id of pods) {
      await node.cri.runtime.RemoveContainer({ container_id: apps[pods.indexOf(id)]! }, slow());
      await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }, slow());
      await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }, slow());
    }
    expect((await node.cri.runtime.ListPodSandbox({})).items).toEqual([]);
    await until('the relays to exit', async (note) => {
      note(relays());
      return relays().length === 0 ? true : undefined;
    });
    // The node server stays for its idle time (30 s) after its last pod, then exits.
    await until('the node server to exit', async () => (isRunning(server) ? undefined : true), 180_000);
    expect(nodeServers()).toEqual([]);
    await until('no process of the shim state root', async (note) => {
      const left = liveProcessesMentioning(node.stateRoot);
      note(left.map((p) => cmdline(p).join(' ')));
      return left.length === 0 ? true : undefined;
    });
    for (const dir of dirs) expect(existsSync(dir)).toBe(false);
    expect(await fsp.readdir(path.join(node.stateRoot, 's'))).toEqual([]);
    // The node server's dir keeps only its log: no lock, no control socket.
    const nodeDirs = await fsp.readdir(path.join(node.stateRoot, 'node'));
    for (const d of nodeDirs) expect(await fsp.readdir(path.join(node.stateRoot, 'node', d))).toEqual(['node.log']);
    expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
    await until('nothing left in the private cgroup tree', async (note) => {
      const strays = await node.ctrd.strayProcesses();
      note(strays);
      return strays.length === 0 ? true : undefined;
    });
    // The sandboxes' tasks ended only now, at their stop.
    expect(taskExits(eventText).filter((e) => pods.includes(e.container_id))).toHaveLength(2);
  });
});
