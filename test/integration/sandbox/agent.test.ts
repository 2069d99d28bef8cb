/**
 * A pod sandbox with its guest agent and virtio-fs, through the CRI socket of a real `kata-ts
 * serve`: real QEMU (TCG here), the real guest image with the real agent (built by
 * scripts/build-guest.sh into a directory of this test's own), the real C virtiofsd, cgroupfs
 * under a private parent. One boot.
 *
 * While the daemon is stopped (its VMs keep running) the test talks to the agent itself through
 * QEMU's socket (it serves one client at a time): that is how it checks what the guest sees of
 * the shared directory, and that a restarted daemon gets the same agent instance back.
 */
import { execFileSync } from 'node:child_process';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../../src/agent-client/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { AGENT_API_VERSION } from '../../../src/generated/agent/agent.js';
import { readProcStat } from '../../../src/hypervisor/index.js';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { ensureAgentGuest } from '../../helpers/agent-guest.js';
import { guestProbeSpec } from '../../helpers/guest-oci-spec.js';
import { untilMatches } from '../../helpers/poll.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';

interface Info {
  pid: number;
  workDir: string;
  /** A confined QEMU's sockets are in its VMM dir (the default handler confines it). */
  confinement: { vmmDir: string | null } | null;
  agent: { connected: boolean; apiVersion: number | null; agentInstanceId: string | null } | null;
  virtiofsd: { pid: number; running: boolean } | null;
  guestPod: { pausePid: number; shmPath: string } | null;
}

async function info(rt: TestRuntime, id: string): Promise<Info> {
  const res = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
  return JSON.parse(res.info.info!) as Info;
}

function alive(pid: number): boolean {
  const stat = readProcStat(pid);
  return stat !== undefined && stat.state !== 'Z' && stat.state !== 'X';
}

/** A minimal OCI spec: write the UTS namespace's hostname into the root filesystem. */
const probeSpec = (pausePid: number, devTmpfs = true) =>
  guestProbeSpec({
    pausePid,
    args: ['/bin/busybox', 'sh', '-c', '/bin/busybox hostname > /hostname.txt'],
    cgroupsPath: '/kata-ts/probe',
    devTmpfs,
  });

describe('a sandbox with its guest agent and virtio-fs', () => {
  let rt: TestRuntime;
  let extraMountSource: string | undefined;
  beforeAll(async () => {
    const guest = ensureAgentGuest();
    rt = await createTestRuntime({ hypervisor: guest });
    await rt.start();
  });
  afterAll(async () => {
    await rt?.cleanup();
    if (extraMountSource !== undefined) await fsp.rm(extraMountSource, { recursive: true, force: true });
  });

  it('Hello, virtiofsd in the pod cgroup, the share seen by the guest and nothing beyond it, restart, stop and remove leave nothing', async () => {
    const config = podConfig(rt, 'agentpod', { hostname: 'agent-pod' });
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config });

    // The daemon holds a live agent session (Hello passed the version check) and the guest's pod.
    const first = await info(rt, id);
    expect(first.agent).toMatchObject({
      connected: true,
      apiVersion: AGENT_API_VERSION,
      hostApiVersion: AGENT_API_VERSION,
      missingFeatures: [],
    });
    expect(first.agent?.agentInstanceId).toMatch(/^[0-9a-f-]{36}$/);
    expect(first.guestPod?.pausePid).toBeGreaterThan(1);
    expect(first.guestPod?.shmPath).toBe(`/run/kata-ts/pods/${id}/shm`);
    const vfsPid = first.virtiofsd!.pid;
    expect(first.virtiofsd?.running).toBe(true);

    // virtiofsd shares the VMM's cgroup (cgroupfs, v1 memory hierarchy here), and so does the
    // sandbox child it forks into its namespaces, which is the one serving the guest's file I/O.
    const uid = (config.metadata as { uid: string }).uid;
    const memoryDir = path.join('/sys/fs/cgroup/memory', rt.cgroupParent(uid), `kata-ts-${id}`);
    const procs = (await fsp.readFile(path.join(memoryDir, 'cgroup.procs'), 'utf8')).split('\n');
    const vfsChildren = (await fsp.readdir(`/proc/${vfsPid}/task`)).flatMap((tid) =>
      readFileSync(`/proc/${vfsPid}/task/${tid}/children`, 'utf8')
        .split(' ')
        .filter((c) => c !== ''),
    );
    expect(vfsChildren).toHaveLength(1);
    expect(procs).toEqual(expect.arrayContaining([String(first.pid), String(vfsPid), ...vfsChildren]));

    // The shared directory: its own bind mount, nodev+nosuid, shared propagation.
    const shared = path.join(first.workDir, 'shared');
    // In the runtime's mount namespace, where the daemon makes its mounts; none of them on the host.
    const line = (await rt.mountinfo()).split('\n').find((l) => l.split(' ')[4] === shared);
    expect(line).toBeDefined();
    expect(line!.split(' ')[5]).toMatch(/nosuid/);
    expect(line!.split(' ')[5]).toMatch(/nodev/);
    expect(line).toMatch(/ shared:\d+/);
    expect(mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), rt.stateDir)).toEqual([]);

    // What the host puts there after boot, including a bind mount added later (as the container
    // layer does), and what must stay out of reach: a file next to the share.
    await fsp.writeFile(path.join(shared, 'hello.txt'), 'from the host\n');
    await fsp.writeFile(path.join(first.workDir, 'secret.txt'), 'host secret\n');
    await fsp.symlink(path.join(first.workDir, 'secret.txt'), path.join(shared, 'abs-link'));
    await fsp.symlink('../secret.txt', path.join(shared, 'rel-link'));
    // A device node of the host's first SCSI disk (8:0): the guest kernel interprets the numbers
    // against its own devices (virtio disks only), so nothing of the host disk can be read.
    execFileSync('mknod', [path.join(shared, 'hostdisk'), 'b', '8', '0']);
    extraMountSource = await fsp.mkdtemp('/tmp/kts-vol-');
    await fsp.writeFile(path.join(extraMountSource, 'volume.txt'), 'bind-mounted later\n');
    const volume = path.join(shared, 'containers', 'c1', 'vol');
    await fsp.mkdir(volume, { recursive: true });
    await rt.inNamespace(['mount', '--bind', '--', extraMountSource, volume]);

    // A busybox root filesystem for a probe container, shared like the container layer shares one.
    const probeRootfs = path.join(shared, 'containers', 'probe', 'rootfs');
    await fsp.mkdir(path.join(probeRootfs, 'bin'), { recursive: true });
    for (const dir of ['proc', 'dev', 'sys', 'tmp']) await fsp.mkdir(path.join(probeRootfs, dir));
    await fsp.copyFile('/bin/busybox', path.join(probeRootfs, 'bin', 'busybox'));
    await fsp.chmod(path.join(probeRootfs, 'bin', 'busybox'), 0o755);

    // Talk to the agent ourselves while the daemon is down (QEMU's socket serves one client).
    await rt.stop();
    const agent = await AgentClient.connect(
      { socketPath: path.join(first.confinement?.vmmDir ?? first.workDir, 'agent.sock'), logger: silentLogger(), hostVersion: 'test' },
      30_000,
    );
    try {
      expect(agent.connection.hello?.agentInstanceId).toBe(first.agent?.agentInstanceId);
      const stat = (relativePath: string, noFollow = false) =>
        agent.statSharedPath({ relativePath, noFollow, readContent: true }, { timeoutMs: 10_000 });
      const hello = await stat('hello.txt');
      expect(hello).toMatchObject({ exists: true, kind: 'FILE_KIND_REGULAR' });
      expect(Buffer.from(hello.content).toString()).toBe('from the host\n');
      const vol = await stat('containers/c1/vol/volume.txt');
      expect(Buffer.from(vol.content).toString()).toBe('bind-mounted later\n');
      // Symlinks are resolved by the guest kernel inside the guest: neither reaches the host file.
      expect(await stat('abs-link', true)).toMatchObject({ kind: 'FILE_KIND_SYMLINK', linkTarget: path.join(first.workDir, 'secret.txt') });
      for (const link of ['abs-link', 'rel-link']) {
        const followed = await stat(link);
        expect(Buffer.from(followed.content).toString()).not.toContain('host secret');
      }
      await expect(stat('../secret.txt')).rejects.toMatchObject({ reason: 'SHARED_PATH_INVALID' });
      const disk = await stat('hostdisk');
      expect(disk).toMatchObject({ exists: true, kind: 'FILE_KIND_BLOCK_DEVICE' });
      expect(disk.content.length).toBe(0);
      expect(disk.error).not.toBe('');
      // The guest cannot make device nodes in the host directory, even as root with every
      // capability: crun, given no /dev tmpfs, creates /dev/null in the shared rootfs and fails.
      const mknod = await agent
        .createContainer(
          {
            containerId: 'mknod',
            ociConfigJson: JSON.stringify(probeSpec(first.guestPod!.pausePid, false)),
            rootfsPath: '/run/kata-ts/shared/containers/probe/rootfs',
            stdio: 'STDIO_MODE_PIPES',
          },
          { timeoutMs: 30_000 },
        )
        .then(
          () => undefined,
          (e: unknown) => e as { details?: { runtimeLog?: string } },
        );
      expect(mknod?.details?.runtimeLog).toMatch(/mknod .*Operation not permitted/);
      await expect(fsp.readdir(path.join(probeRootfs, 'dev'))).resolves.toEqual([]);

      // crun in the guest runs a container whose rootfs comes through virtio-fs, with pivot_root
      // (init switched the guest to a tmpfs root), in the pod's UTS namespace (its hostname).
      const ctr = await agent.createContainer(
        {
          containerId: 'probe',
          ociConfigJson: JSON.stringify(probeSpec(first.guestPod!.pausePid)),
          rootfsPath: '/run/kata-ts/shared/containers/probe/rootfs',
          stdio: 'STDIO_MODE_PIPES',
        },
        { timeoutMs: 30_000 },
      );
      expect(ctr.pid).toBeGreaterThan(0);
      await agent.startContainer('probe', { timeoutMs: 30_000 });
      expect(await agent.waitContainer('probe', { timeoutMs: 30_000 })).toMatchObject({ exitCode: 0 });
      expect(await fsp.readFile(path.join(probeRootfs, 'hostname.txt'), 'utf8')).toBe('agent-pod\n');
      await agent.deleteContainer('probe', true, { timeoutMs: 30_000 });
      // CreatePod again (as after an agent or daemon restart) answers the same pod.
      const again = await agent.createPod({ podId: id, hostname: 'agent-pod' }, { timeoutMs: 10_000 });
      expect(again).toMatchObject({ pausePid: first.guestPod?.pausePid, shmPath: first.guestPod?.shmPath, sharedDirMounted: true });
    } finally {
      agent.close();
    }

    // The restarted daemon reconnects to the same agent instance.
    await rt.start();
    const after = await untilMatches(
      'the restarted daemon to reconnect to the agent',
      () => info(rt, id),
      (i) => i.agent?.connected === true,
      30_000,
    );
    expect(after.agent?.agentInstanceId).toBe(first.agent?.agentInstanceId);
    expect(after.guestPod).toEqual(first.guestPod);
    expect(after.virtiofsd).toEqual({ pid: vfsPid, running: true });

    // Stop: virtiofsd gone, every mount under the work dir released (the later bind mount too).
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
    expect(alive(vfsPid)).toBe(false);
    expect(mountsUnder(await rt.mountinfo(), first.workDir)).toEqual([]);
    const stopped = await info(rt, id);
    expect([stopped.agent, stopped.virtiofsd, stopped.guestPod]).toEqual([null, null, null]);
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    await expect(fsp.stat(first.workDir)).rejects.toMatchObject({ code: 'ENOENT' });
    // The bind-mounted volume's own files are untouched by the removal.
    expect(await fsp.readFile(path.join(extraMountSource, 'volume.txt'), 'utf8')).toBe('bind-mounted later\n');
    expect(await leftovers(rt)).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
  });
});
