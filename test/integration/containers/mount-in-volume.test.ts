/**
 * A privileged container mounts inside its host-path volume, as critest's mount propagation specs
 * do (`mount with 'rprivate' should not support propagation`, `mount with 'rslave' should support
 * propagation from host to container`): the host path is a bind of itself (private for the one,
 * shared for the other), the host binds a directory under it after the container started, and the
 * container runs `mount --bind /etc <volume>/containerMntPoint` in an ExecSync. The mount is made,
 * the container sees /etc there, the host does not; the host's own mount reaches the rslave
 * container and not the rprivate one. One VM (both containers in one pod).
 *
 * Through the standalone daemon with the real agent. How long each exec took, and how long
 * mount(8) itself took inside it, are printed (critest gives the exec 30 s, and session E's full
 * run through containerd once ran past it; test/conformance/README.md, session F, has what was
 * measured since); timings are never asserted.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);

type Propagation = 'PROPAGATION_PRIVATE' | 'PROPAGATION_HOST_TO_CONTAINER';

/** critest's layout: `<hostPath>/mnt` is the volume, `mnt/propagationMnt` the host's later mount point. */
interface VolumeLayout {
  mntSource: string;
  propagationSrcDir: string;
  propagationMntPoint: string;
  containerMntPoint: string;
}

async function makeVolume(base: string, propagation: Propagation): Promise<VolumeLayout> {
  const mntSource = path.join(base, 'mnt');
  const layout = {
    mntSource,
    propagationSrcDir: path.join(base, 'propagationSrcDir'),
    propagationMntPoint: path.join(mntSource, 'propagationMnt'),
    containerMntPoint: path.join(mntSource, 'containerMntPoint'),
  };
  await fsp.mkdir(layout.propagationMntPoint, { recursive: true, mode: 0o700 });
  await fsp.mkdir(layout.propagationSrcDir, { recursive: true, mode: 0o700 });
  await fsp.writeFile(path.join(layout.propagationSrcDir, 'flagFile'), '');
  await execFileAsync('mount', ['--rbind', mntSource, mntSource]);
  await execFileAsync('mount', [propagation === 'PROPAGATION_PRIVATE' ? '--make-rprivate' : '--make-rshared', mntSource]);
  return layout;
}

describe('a privileged container mounts inside its host-path volume (critest mount propagation)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image = '';
  const hostMounts: string[] = [];

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', ['sleep', 'top', 'sh', 'mount', 'mkdir', 'ls', 'cat', 'grep']);
    rt = await createTestRuntime({ images: { registriesConfigPath: '/dev/null' } });
    await allowLoopbackRegistries(rt);
    // A shared tree, as systemd makes a host's: the volumes' later submounts reach the runtime's
    // mount namespace (a slave of this one), as critest's reach it through containerd's shim.
    await execFileAsync('mount', ['--bind', rt.dir, rt.dir]);
    await execFileAsync('mount', ['--make-shared', rt.dir]);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      // Deepest first: the host's own binds under the volumes, then the volumes' binds of themselves.
      for (const m of hostMounts.reverse()) await execFileAsync('umount', ['-l', '--', m]).catch(() => undefined);
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it(
    'rprivate and rslave: `mount --bind /etc` in the volume is made and seen by the container only; the host mount reaches only rslave',
    async () => {
      const layouts = {} as Record<Propagation, VolumeLayout>;
      for (const p of ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER'] as const) {
        layouts[p] = await makeVolume(path.join(rt.dir, p === 'PROPAGATION_PRIVATE' ? 'rprivate' : 'rslave'), p);
        hostMounts.push(layouts[p].mntSource);
      }
      const sandboxConfig = podConfig(rt, 'mountprop', {
        log_directory: path.join(rt.dir, 'pod-logs'),
        linux: {
          cgroup_parent: rt.cgroupParent('mountprop'),
          security_context: { privileged: true, namespace_options: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } },
        },
      });
      const sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
      const ids = {} as Record<Propagation, string>;
      for (const p of ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER'] as const) {
        const { mntSource } = layouts[p];
        ids[p] = (
          await rt.cri.runtime.CreateContainer({
            pod_sandbox_id: sid,
            config: {
              metadata: { name: p === 'PROPAGATION_PRIVATE' ? 'rprivate' : 'rslave', attempt: 0 },
              image: { image },
              command: ['sh', '-c', 'top'],
              log_path: `${p}.log`,
              linux: { security_context: { privileged: true } },
              mounts: [{ container_path: mntSource, host_path: mntSource, readonly: false, propagation: p }],
            },
            sandbox_config: sandboxConfig,
          })
        ).container_id;
        await rt.cri.runtime.StartContainer({ container_id: ids[p] });
      }

      const exec = async (p: Propagation, cmd: string[]) => {
        const startedMs = performance.now();
        const r = await rt.cri.runtime.ExecSync({ container_id: ids[p], cmd, timeout: 120 });
        return { exit: r.exit_code, out: r.stdout.toString(), err: r.stderr.toString(), ms: performance.now() - startedMs };
      };

      for (const p of ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER'] as const) {
        const l = layouts[p];
        // The host binds a directory under the volume after the container started.
        await execFileAsync('mount', ['--bind', l.propagationSrcDir, l.propagationMntPoint]);
        hostMounts.push(l.propagationMntPoint);
        const seen = await exec(p, ['ls', '-A', l.propagationMntPoint]);
        console.log(`[mount-in-volume] ${p}: ExecSync of 'ls -A' took ${Math.round(seen.ms)} ms`);
        expect(seen.exit).toBe(0);
        expect(seen.out.trim()).toBe(p === 'PROPAGATION_PRIVATE' ? '' : 'flagFile');

        const made = await exec(p, ['sh', '-c', `mkdir -p ${l.containerMntPoint}`]);
        expect(made.exit).toBe(0);
        console.log(`[mount-in-volume] ${p}: ExecSync of 'mkdir -p' took ${Math.round(made.ms)} ms`);
        // critest's exec, with the guest's uptime around the mount(2) to tell it from the exec's own cost.
        const mounted = await exec(p, [
          'sh',
          '-c',
          `cat /proc/uptime; mount --bind /etc ${l.containerMntPoint}; r=$?; cat /proc/uptime; exit $r`,
        ]);
        expect([mounted.exit, mounted.err]).toEqual([0, '']);
        const [before, after] = mounted.out
          .trim()
          .split('\n')
          .map((line) => Number(line.split(' ')[0]));
        console.log(
          `[mount-in-volume] ${p}: ExecSync of 'mount --bind /etc' took ${Math.round(mounted.ms)} ms; mount(8) inside it ${Math.round(((after ?? Number.NaN) - (before ?? Number.NaN)) * 1000)} ms (guest uptime)`,
        );

        // The container sees /etc there; the host's directory stays empty (no propagation back).
        const inside = await exec(p, ['ls', '-A', l.containerMntPoint]);
        expect(inside.exit).toBe(0);
        expect(inside.out.split('\n')).toContain('passwd');
        expect(await fsp.readdir(l.containerMntPoint)).toEqual([]);
        const again = await exec(p, ['sh', '-c', 'true']);
        console.log(`[mount-in-volume] ${p}: a plain ExecSync afterwards took ${Math.round(again.ms)} ms`);
      }

      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    },
    scaledMs(600_000),
  );
});
