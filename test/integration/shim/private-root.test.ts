/**
 * kata-ts behind the real containerd (Debian's 1.6.20) on a node whose root mount is PRIVATE, as
 * on a host that runs no systemd (test/helpers/containerd.ts `privateRoot`): the runtime's mount
 * namespace, made by the first shim `start`, then never receives what containerd mounts later,
 * above all the pod's network namespace (a bind mount of an nsfs file under containerd's state
 * dir). The shim's `start` hands its `serve` a directory descriptor of containerd's root, and the
 * shim names the paths containerd gave it through that (src/common/caller-root.ts); without that,
 * RunPodSandbox failed with "is not a namespace file".
 *
 * The runtime's namespace is made before containerd's first pod (as where it exists from boot):
 * containerd makes its netns directory a shared mount only with its first pod, too late for a copy
 * made before. One pod VM: RunPodSandbox with the kata-ts handler (the netns bind mount checked invisible in
 * the runtime's namespace), a container whose output reaches the CRI log through containerd's
 * FIFOs and whose exec shows the pod's address, then the shim SIGKILLed: containerd's `delete`
 * (a new process, with a descriptor of its own) removes the TAP from the pod's network namespace
 * and leaves no QEMU, mount or state. Skipped with a notice when containerd is not installed.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { parseMountEntries } from '../../../src/runtime/mount-namespace.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER, mountPointsUnder } from '../../helpers/containerd.js';
import { until, untilLogLines } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`kata-ts behind containerd on a private root skipped: ${MISSING}`);

describe.skipIf(MISSING !== null)('kata-ts behind containerd 1.6.20 on a node whose root mount is private', () => {
  const node = new ShimNode('/tmp/ktp-');
  let image = '';
  let logDir = '';
  let podId = '';
  let podIp = '';
  let netnsPath = '';
  const podUid = randomUUID();
  const sandboxConfig = (): PodSandboxConfig => ({
    metadata: { name: 'private', uid: podUid, namespace: 'default', attempt: 0 },
    hostname: 'private-pod',
    log_directory: logDir,
    linux: { cgroup_parent: `/kubepods/burstable/pod${podUid}` },
  });
  const runtimeMountinfo = () => node.ctrd.nodeExec(['nsenter', `--mount=${node.mountNamespacePath}`, '--', 'cat', '/proc/self/mountinfo']);
  const nodeMountinfo = () => node.ctrd.nodeExec(['cat', '/proc/self/mountinfo']);
  const shimPids = () =>
    liveProcessesMentioning(`-id\u0000${podId}`).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('serve'));
  const podLinks = () => node.ctrd.nodeExec(['nsenter', `--net=${netnsPath}`, '--', 'ip', '-o', 'link', 'show']);

  /**
   * The runtime's mount namespace made inside the node before containerd's first pod, by kata-ts's
   * own code, as on a node where it already exists (made at boot by `kata-ts serve`, or by an
   * earlier shim) when containerd first bind-mounts its netns directory.
   */
  const makeRuntimeNamespace = () => {
    const href = (rel: string) => JSON.stringify(pathToFileURL(path.join(packageRoot(), rel)).href);
    const script = [
      `const ns = await import(${href('src/runtime/mount-namespace.ts')});`,
      `const log = await import(${href('src/common/logger.ts')});`,
      `await ns.ensureMountNamespace(${JSON.stringify(node.mountNamespacePath)}, log.silentLogger());`,
    ].join('\n');
    const loader = pathToFileURL(path.join(packageRoot(), 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
    return node.ctrd.nodeExec([process.execPath, '--import', loader, '--input-type=module', '-e', script], 60_000);
  };

  beforeAll(async () => {
    await node.start({ containerd: { privateRoot: true } });
    await makeRuntimeNamespace();
    image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'private-root', ['sleep', 'ip', 'cat']);
    logDir = await node.podLogDir('private', podUid);
    await node.cri.image.PullImage({ image: { image } });
  });

  afterAll(() => node.stop());

  it("the node's root mount is private (nothing it mounts later propagates)", async () => {
    const root = parseMountEntries(await nodeMountinfo())
      .filter((e) => e.point === '/')
      .at(-1);
    expect(root?.shared).toBe(false);
    // The runtime's namespace exists, and containerd has mounted no netns yet.
    expect(mountPointsUnder(await runtimeMountinfo(), node.ctrd.netnsDir)).toEqual([]);
    expect(mountPointsUnder(await nodeMountinfo(), node.ctrd.netnsDir)).toEqual([]);
  });

  it("RunPodSandbox boots the VM in containerd's pod network namespace, a bind mount the runtime's namespace does not see", async () => {
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
    // The path containerd handed the shim, from the pause container's spec.
    const spec = JSON.parse(await fsp.readFile(path.join(node.ctrd.bundleDir(podId), 'config.json'), 'utf8')) as {
      linux: { namespaces: { type: string; path?: string }[] };
    };
    netnsPath = spec.linux.namespaces.find((n) => n.type === 'network')?.path ?? '';
    expect(netnsPath.startsWith(node.ctrd.netnsDir)).toBe(true);
    // Mounted in containerd's namespace, absent from the runtime's: what the shim could not open before.
    expect(mountPointsUnder(await nodeMountinfo(), netnsPath)).toEqual([netnsPath]);
    expect(mountPointsUnder(await runtimeMountinfo(), netnsPath)).toEqual([]);
    // The TAP was wired into containerd's namespace beside eth0.
    expect(await podLinks()).toMatch(/tap0_kata/);
    expect(shimPids()).toHaveLength(1);
    // The shim holds containerd's root once; nothing it started (QEMU, virtiofsd) inherited it.
    const ctrdRoot = statSync(`/proc/${node.ctrd.pid}/root`);
    const rootFds = (pid: number) =>
      readdirSync(`/proc/${pid}/fd`).filter((fd) => {
        try {
          const st = statSync(`/proc/${pid}/fd/${fd}`);
          return st.isDirectory() && st.dev === ctrdRoot.dev && st.ino === ctrdRoot.ino;
        } catch {
          return false;
        }
      });
    expect(rootFds(shimPids()[0]!)).toHaveLength(1);
    const children = liveProcessesMentioning(path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16)));
    expect(children.length).toBeGreaterThan(1);
    for (const pid of children) expect(rootFds(pid), readFileSync(`/proc/${pid}/cmdline`, 'utf8')).toEqual([]);
  });

  it("a container: output through containerd's FIFOs into the CRI log, and an exec sees the pod's address", async () => {
    const appId = (
      await node.cri.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: {
          metadata: { name: 'app', attempt: 0 },
          image: { image },
          command: ['sh', '-c', 'echo hello from a private root; echo to stderr >&2; while :; do sleep 1 & wait $!; done'],
          log_path: 'app.log',
        },
        sandbox_config: sandboxConfig(),
      })
    ).container_id;
    await node.cri.runtime.StartContainer({ container_id: appId });
    await untilLogLines(
      'the container output in the CRI log',
      [path.join(logDir, 'app.log')],
      (l) => l.includes('stdout F hello from a private root') && l.includes('stderr F to stderr'),
    );
    const ip = await node.cri.runtime.ExecSync({ container_id: appId, cmd: ['ip', '-4', '-o', 'addr'], timeout: 60 });
    expect(ip.stdout.toString()).toContain(`inet ${podIp}/`);
  });

  it("the shim SIGKILLed: containerd's delete (its own descriptor of containerd's root) unwires the TAP and leaves nothing", async () => {
    const [shim] = shimPids();
    const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
    process.kill(shim!, 'SIGKILL');
    await until('the shim to be gone', async (note) => {
      note(isRunning(shim!));
      return isRunning(shim!) ? undefined : true;
    });
    await until('the pod state removed by delete', async (note) => {
      note(existsSync(podDir) ? readdirSync(podDir) : 'gone');
      return existsSync(podDir) ? undefined : true;
    });
    expect(liveProcessesMentioning(podDir)).toEqual([]);
    // containerd still holds the namespace (until StopPodSandbox); the TAP in it is gone, eth0 stays.
    const links = await podLinks();
    expect(links).toMatch(/eth0/);
    expect(links).not.toMatch(/tap0_kata/);
    const cleanupLog = await fsp.readFile(path.join(node.stateRoot, 'cleanup.log'), 'utf8').catch(() => '');
    expect(cleanupLog).not.toMatch(/netns|namespace file/);
    expect(mountPointsUnder(await runtimeMountinfo(), podDir)).toEqual([]);
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
    expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
  });
});
