/**
 * The runtime's mounts stay out of the host's mount table (issue #25): with a pod running and a
 * volume whose host path holds a tmpfs submount, the host's table holds none of the daemon's
 * mounts, and the host unmounts the submount and removes its directory while the container runs
 * (made in the host's namespace, the volume's recursive bind copied the submount and the rmdir
 * answered EBUSY). A restarted daemon enters the same namespace and finds its mounts again. One VM.
 *
 * The test's directory is made a shared mount first, as systemd makes a host's mounts: the tmpfs
 * mounted after the daemon started then reaches the runtime's namespace (a slave of this one) the
 * way a kubelet's later volume mounts reach it on a real node.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { boundNamespace, namespaceOf } from '../../../src/runtime/mount-namespace.js';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const hostMountinfo = () => fsp.readFile('/proc/self/mountinfo', 'utf8');
/** Mount point and file system type of each line of a mount table. */
const mounts = (mountinfo: string) =>
  mountinfo
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const f = l.split(' ');
      return { point: f[4]!, fstype: f[f.indexOf('-') + 1]! };
    });

describe("the runtime's mounts and the host's", () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image = '';
  let volume = '';
  let sub = '';

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', ['sleep', 'cat']);
    rt = await createTestRuntime({ images: { registriesConfigPath: '/dev/null' } });
    await allowLoopbackRegistries(rt);
    await execFileAsync('mount', ['--bind', rt.dir, rt.dir]);
    await execFileAsync('mount', ['--make-shared', rt.dir]);
    volume = path.join(rt.dir, 'volume');
    sub = path.join(volume, 'sub');
    await fsp.mkdir(sub, { recursive: true });
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      // Stops the daemon, removes its namespace, unmounts the test's own mounts, removes the directory.
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it(
    'a volume holding a tmpfs submount: none of the runtime mounts on the host, which unmounts and removes the submount while the container runs; a restart finds the mounts again',
    async () => {
      // A host mount made after the daemon started reaches it.
      await execFileAsync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'kata-ts-test-sub', sub]);
      await fsp.writeFile(path.join(sub, 'hello'), 'from a tmpfs submount\n');
      expect(mounts(await rt.mountinfo()).some((m) => m.point === sub && m.fstype === 'tmpfs')).toBe(true);

      const sandboxConfig = { ...podConfig(rt, 'hostmounts'), log_directory: path.join(rt.dir, 'pod-logs') };
      const sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
      const cid = (
        await rt.cri.runtime.CreateContainer({
          pod_sandbox_id: sid,
          config: {
            metadata: { name: 'app', attempt: 0 },
            image: { image },
            command: ['sleep', '3600'],
            log_path: 'app.log',
            mounts: [{ container_path: '/vol', host_path: volume, readonly: false, propagation: 'PROPAGATION_PRIVATE' }],
          },
          sandbox_config: sandboxConfig,
        })
      ).container_id;
      await rt.cri.runtime.StartContainer({ container_id: cid });
      const read = await rt.cri.runtime.ExecSync({ container_id: cid, cmd: ['cat', '/vol/sub/hello'], timeout: 60 });
      expect([read.exit_code, read.stdout.toString()]).toEqual([0, 'from a tmpfs submount\n']);

      // The daemon's mounts (the shared dir, the volume's bind and its copy of the submount) are
      // in the runtime's namespace; on the host there is none of them: under the state dir
      // nothing, under the test's directory only its own mounts and the namespace's anchor.
      const inRuntime = mounts(await rt.mountinfo());
      expect(inRuntime.some((m) => m.point.startsWith(`${rt.stateDir}/`) && m.point.endsWith('/sub') && m.fstype === 'tmpfs')).toBe(true);
      const host = await hostMountinfo();
      expect(mountsUnder(host, rt.stateDir)).toEqual([]);
      const nsDir = path.dirname(rt.mountNamespacePath);
      expect(mountsUnder(host, rt.dir).sort()).toEqual([rt.dir, nsDir, rt.mountNamespacePath, sub].sort());

      // The host takes its submount away and removes the directory, the container still running.
      await execFileAsync('umount', ['--', sub]);
      await fsp.rmdir(sub);
      await expect(fsp.stat(sub)).rejects.toMatchObject({ code: 'ENOENT' });
      expect((await rt.cri.runtime.ContainerStatus({ container_id: cid })).status?.state).toBe('CONTAINER_RUNNING');
      const alive = await rt.cri.runtime.ExecSync({ container_id: cid, cmd: ['cat', '/proc/self/stat'], timeout: 60 });
      expect(alive.exit_code).toBe(0);

      // A restarted daemon is in the same namespace and finds its mounts there.
      const ns = await boundNamespace(rt.mountNamespacePath);
      const sharedDirMounts = mountsUnder(await rt.mountinfo(), rt.stateDir);
      expect(sharedDirMounts.length).toBeGreaterThan(0);
      await rt.restart();
      expect(namespaceOf(rt.pid())).toEqual(ns);
      expect(mountsUnder(await rt.mountinfo(), rt.stateDir)).toEqual(sharedDirMounts);
      expect((await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid })).status?.state).toBe('SANDBOX_READY');
      const again = await rt.cri.runtime.ExecSync({ container_id: cid, cmd: ['sleep', '0'], timeout: 60 });
      expect(again.exit_code).toBe(0);

      // Removing the pod releases every one of them; the host never had any.
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      expect(mountsUnder(await rt.mountinfo(), rt.stateDir)).toEqual([]);
      expect(mountsUnder(await hostMountinfo(), rt.stateDir)).toEqual([]);
    },
    scaledMs(420_000),
  );
});
