/**
 * Container root filesystems as overlays of shared layers, through a real daemon and one real VM:
 * the container runs on the overlay over virtio-fs (sees its image's files, not a file a whiteout
 * deleted); the overlay is mounted in the runtime's namespace, not the host's; the container's
 * writes land in its upper directory and never in a layer; a daemon crash + restart finds the
 * overlay (mounting it again when it went) and tears down one no record names; RemoveContainer
 * unmounts it and removes its upper; RemoveImage then removes the layers. One VM.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { allowLoopbackRegistries } from '../../helpers/busybox-image.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type BuiltImage, buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import type { TarEntrySpec } from '../../helpers/images-tar.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const hex = (d: string): string => d.slice('sha256:'.length);
const applets = ['sleep', 'cat', 'sh', 'ls', 'echo', 'test'].map(
  (a): TarEntrySpec => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' }),
);

/** Mount points and types of a mount table. */
function mounts(mountinfo: string): Array<{ point: string; fstype: string }> {
  return mountinfo
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const f = l.split(' ');
      return { point: f[4] as string, fstype: f[f.indexOf('-') + 1] as string };
    });
}

describe('container root filesystems as overlays of shared layers', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let built: BuiltImage;
  let image = '';

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    built = await buildImage({
      layers: [
        {
          entries: [
            ...busyboxBaseEntries(),
            ...applets,
            { name: 'etc/doomed', content: 'base\n' },
            { name: 'app/base.txt', content: 'base\n' },
          ],
          compression: 'gzip',
        },
        { entries: [{ name: 'etc/.wh.doomed' }, { name: 'app/top.txt', content: 'top\n' }], compression: 'gzip' },
      ],
      cmd: ['/bin/sh'],
    });
    await new RegistryPusher(registry.url).pushImage('kata/layered', '1', built);
    image = `${registry.host}/kata/layered:1`;
    // A shared two-core machine boots slowly when other VMs run: the ready wait scales like the test's bounds.
    rt = await createTestRuntime({ images: { registriesConfigPath: '/dev/null' }, hypervisor: { readyTimeoutMs: scaledMs(180_000) } });
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it(
    'runs on the overlay in the VM, keeps it out of the host table, survives a crash, and goes with the container and the image',
    async () => {
      const layers = path.join(rt.stateDir, 'images', 'layers');
      expect((await fsp.readdir(layers)).sort()).toEqual(built.diffIds.map(hex).sort());

      const sandboxConfig = { ...podConfig(rt, 'overlay'), log_directory: path.join(rt.dir, 'pod-logs') };
      const sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
      const cid = (
        await rt.cri.runtime.CreateContainer({
          pod_sandbox_id: sid,
          config: { metadata: { name: 'app', attempt: 0 }, image: { image }, command: ['sleep', '3600'], log_path: 'app.log' },
          sandbox_config: sandboxConfig,
        })
      ).container_id;
      await rt.cri.runtime.StartContainer({ container_id: cid });
      const exec = async (cmd: string[]) => {
        const r = await rt.cri.runtime.ExecSync({ container_id: cid, cmd, timeout: 60 });
        return { code: r.exit_code, out: r.stdout.toString() };
      };

      // In the VM: the image's files from both layers, not the whited-out one.
      expect(await exec(['cat', '/app/base.txt', '/app/top.txt'])).toEqual({ code: 0, out: 'base\ntop\n' });
      expect((await exec(['test', '-e', '/etc/doomed'])).code).not.toBe(0);

      // The record names the overlay; the runtime's namespace has it mounted, the host's does not.
      const dir = path.join(rt.stateDir, 'rootfs', cid);
      const merged = path.join(dir, 'merged');
      const record = JSON.parse(await fsp.readFile(path.join(rt.stateDir, 'containers', `${cid}.json`), 'utf8')).record;
      expect(record.rootfs).toBe(merged);
      expect(record.rootfsOverlay).toEqual({ dir, lowerDirs: [...built.diffIds].reverse().map((d) => path.join(layers, hex(d))) });
      expect(mounts(await rt.mountinfo())).toContainEqual({ point: merged, fstype: 'overlay' });
      expect(mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), rt.stateDir)).toEqual([]);

      // A write in the container goes to its upper directory; the layer is unchanged.
      expect((await exec(['sh', '-c', 'echo guest > /etc/passwd && echo new > /made-here'])).code).toBe(0);
      const baseLayer = path.join(layers, hex(built.diffIds[0] as string));
      expect(await fsp.readFile(path.join(baseLayer, 'etc/passwd'), 'utf8')).toContain('root:x:0:0');
      expect(await fsp.readFile(path.join(dir, 'upper/etc/passwd'), 'utf8')).toBe('guest\n');
      expect(await fsp.readFile(path.join(dir, 'upper/made-here'), 'utf8')).toBe('new\n');
      await expect(fsp.stat(path.join(baseLayer, 'made-here'))).rejects.toMatchObject({ code: 'ENOENT' });

      // A crash; meanwhile the overlay is unmounted (as if the namespace had lost it) and an
      // overlay of no container is left behind (a create that crashed before its record).
      await rt.crash();
      await rt.inNamespace(['umount', '--', merged]);
      const orphan = path.join(rt.stateDir, 'rootfs', 'orphan-of-a-crash');
      for (const d of ['upper', 'work', 'merged']) await fsp.mkdir(path.join(orphan, d), { recursive: true });
      await rt.inNamespace([
        'mount',
        '-t',
        'overlay',
        '-o',
        `lowerdir=${baseLayer},upperdir=${orphan}/upper,workdir=${orphan}/work`,
        '--',
        'overlay',
        `${orphan}/merged`,
      ]);
      await rt.start();
      const after = mounts(await rt.mountinfo());
      expect(after).toContainEqual({ point: merged, fstype: 'overlay' });
      expect(after.some((m) => m.point.startsWith(orphan))).toBe(false);
      await expect(fsp.stat(orphan)).rejects.toMatchObject({ code: 'ENOENT' });
      expect((await rt.cri.runtime.ContainerStatus({ container_id: cid })).status?.state).toBe('CONTAINER_RUNNING');
      expect(await exec(['cat', '/made-here'])).toEqual({ code: 0, out: 'new\n' });

      // RemoveImage is refused while the container uses the image.
      await expect(rt.cri.image.RemoveImage({ image: { image } })).rejects.toMatchObject({ code: 9 });

      // RemoveContainer unmounts the overlay and removes its upper directory.
      await rt.cri.runtime.StopContainer({ container_id: cid, timeout: 0 });
      await rt.cri.runtime.RemoveContainer({ container_id: cid });
      expect(mounts(await rt.mountinfo()).some((m) => m.point.startsWith(dir))).toBe(false);
      await expect(fsp.stat(dir)).rejects.toMatchObject({ code: 'ENOENT' });

      // RemoveImage removes the layers no image holds any more.
      await rt.cri.image.RemoveImage({ image: { image } });
      expect(await fsp.readdir(layers)).toEqual([]);
    },
    scaledMs(600_000),
  );
});
