/**
 * A hostile container (root in the guest, with the default capabilities: CAP_MKNOD and CAP_SETFCAP
 * among them) attacks the host through its volumes, which virtiofsd (root on the host) serves:
 * an emptyDir-like directory (0777, as the kubelet makes one) and a hostPath holding a tmpfs
 * submount that is NOT nosuid on the host. One VM, two containers: the first binds its volumes
 * privately (staged, then moved into the share), the second host-to-container (bound in place), the
 * two ways the runtime binds a volume.
 *
 * What is proven, and what is not (docs/virtiofsd.md):
 * - device nodes and file capabilities cannot be made in a volume at all (virtiofsd runs without
 *   CAP_MKNOD and CAP_SETFCAP, and with xattrs off); a control in the container's own /dev shows
 *   the container holds both capabilities;
 * - a set-uid-root or set-gid-root program CAN be left in the volume's host directory (virtiofsd
 *   serves guest root as host root; measured why it must, see the doc): the tests stat it so.
 *   Run through the runtime's bind of that directory (the path virtiofsd exports) as an
 *   unprivileged host user it gets no privilege (the bind is nosuid, submounts included); the
 *   same bytes copied by the test to a mount that honours set-uid do run as root, so the program
 *   really is set-uid root and only the bind's nosuid stops it.
 */
import { execFile } from 'node:child_process';
import { promises as fsp, readFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sandboxSharedDir } from '../../../src/runtime/sandbox/paths.js';
import { allowLoopbackRegistries } from '../../helpers/busybox-image.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import type { TarEntrySpec } from '../../helpers/images-tar.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const S_ISUID = 0o4000;
const S_ISGID = 0o2000;
const NOBODY = 65534;
/** A program that prints its effective uid (`-u`) or gid (`-g`): the host's coreutils `id`. */
const EUID_PROGRAM = '/usr/bin/id';
/** A capability xattr value would need xattrs; setcap names the first capability that makes a file privileged. */
const FILE_CAP = 'cap_setuid+ep';

/** Busybox, plus the host's setcap with the libraries it loads (at the same paths). */
function attackImageEntries(): TarEntrySpec[] {
  const extra = ['/usr/sbin/setcap', '/lib/x86_64-linux-gnu/libcap.so.2', '/lib/x86_64-linux-gnu/libc.so.6', '/lib64/ld-linux-x86-64.so.2'];
  const dirs = new Set<string>();
  for (const f of extra) {
    const parts = path.dirname(f).slice(1).split('/');
    for (let i = 1; i <= parts.length; i++) dirs.add(`${parts.slice(0, i).join('/')}/`);
  }
  return [
    ...busyboxBaseEntries(),
    ...['sleep', 'chmod', 'mknod', 'mkdir', 'stat', 'cp', 'rm'].map(
      (a): TarEntrySpec => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' }),
    ),
    ...[...dirs].sort().map((name): TarEntrySpec => ({ name, type: 'directory' })),
    ...extra.map((f): TarEntrySpec => ({ name: f.slice(1), content: readFileSync(realpathSync(f)), mode: 0o755 })),
  ];
}

describe('a root container attacks the host through its virtio-fs volumes', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image = '';
  let emptyDir = '';
  let hostPath = '';
  let submount = '';
  let suidMount = '';
  let sandboxId = '';
  const containers: Record<'private' | 'slave', string> = { private: '', slave: '' };

  /** Run `cmd` (argv) in a container; its exit code and output. */
  const exec = async (which: keyof typeof containers, cmd: string[]) => {
    const r = await rt.cri.runtime.ExecSync({ container_id: containers[which], cmd, timeout: 60 });
    return { code: r.exit_code, out: r.stdout.toString().trim(), err: r.stderr.toString().trim() };
  };

  /**
   * The host path, in the runtime's mount namespace, at which the runtime bound a container's
   * `n`-th volume into the shared directory (what virtiofsd exports as that volume).
   */
  const bindPathOf = async (which: keyof typeof containers, n: number): Promise<string> => {
    const suffix = `/containers/${containers[which]}/mounts/${n}`;
    const points = (await rt.mountinfo())
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .filter((p) => p.startsWith(`${rt.stateDir}/`) && p.endsWith(suffix));
    expect(points.length).toBeGreaterThan(0);
    return points[0]!;
  };

  /**
   * Execute `file` as uid/gid 65534 (no groups) in the runtime's mount namespace and return what
   * it prints for `arg`. The file is opened by root and run through /proc/self/fd, so the
   * runtime's 0700 directories above it do not stop nobody: only the flags of the mount the file
   * is on decide whether its set-id bits apply.
   */
  const runAsNobody = async (file: string, arg: '-u' | '-g', inRuntime: boolean): Promise<string> => {
    const argv = [
      'sh',
      '-c',
      'exec 3<"$1" && exec setpriv --reuid=65534 --regid=65534 --clear-groups /proc/self/fd/3 "$2"',
      'sh',
      file,
      arg,
    ];
    if (inRuntime) return (await rt.inNamespace(argv)).trim();
    return (await execFileAsync(argv[0]!, argv.slice(1))).stdout.trim();
  };

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    const built = await buildImage({ layers: [{ entries: attackImageEntries(), compression: 'gzip' }], cmd: ['/bin/sh'] });
    await new RegistryPusher(registry.url).pushImage('kata/attacker', '1.0', built);
    image = `${registry.host}/kata/attacker:1.0`;
    rt = await createTestRuntime({ images: { registriesConfigPath: '/dev/null' } });
    await allowLoopbackRegistries(rt);
    // An emptyDir as the kubelet makes one (world-writable), and a hostPath with a tmpfs submount
    // that is not nosuid: both made before the daemon starts, so its mount namespace has them.
    emptyDir = path.join(rt.dir, 'pods', 'uid', 'volumes', 'kubernetes.io~empty-dir', 'scratch');
    await fsp.mkdir(emptyDir, { recursive: true });
    await fsp.chmod(emptyDir, 0o777);
    hostPath = path.join(rt.dir, 'hostpath');
    submount = path.join(hostPath, 'sub');
    await fsp.mkdir(submount, { recursive: true });
    await execFileAsync('mount', ['-t', 'tmpfs', '-o', 'size=16m,mode=0755', 'kata-ts-test-attack-sub', submount]);
    for (const dir of [emptyDir, hostPath, submount]) await fsp.copyFile(EUID_PROGRAM, path.join(dir, 'euid-src'));
    // Where the test copies what the guest made, to show it would run set-uid elsewhere: a tmpfs
    // without nosuid (the test's /tmp may be nosuid), in the host's namespace.
    suidMount = path.join(rt.dir, 'suid-honoured');
    await fsp.mkdir(suidMount);
    await execFileAsync('mount', ['-t', 'tmpfs', '-o', 'size=16m,mode=0755', 'kata-ts-test-attack-ctl', suidMount]);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });

    const sandboxConfig = { ...podConfig(rt, 'vfsattack'), log_directory: path.join(rt.dir, 'pod-logs') };
    sandboxId = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
    for (const [which, propagation] of [
      ['private', 'PROPAGATION_PRIVATE'],
      ['slave', 'PROPAGATION_HOST_TO_CONTAINER'],
    ] as const) {
      containers[which] = (
        await rt.cri.runtime.CreateContainer({
          pod_sandbox_id: sandboxId,
          config: {
            metadata: { name: `attacker-${which}`, attempt: 0 },
            image: { image },
            command: ['sleep', '3600'],
            log_path: `${which}.log`,
            mounts: [
              { container_path: '/empty', host_path: emptyDir, readonly: false, propagation },
              { container_path: '/host', host_path: hostPath, readonly: false, propagation },
            ],
          },
          sandbox_config: sandboxConfig,
        })
      ).container_id;
      await rt.cri.runtime.StartContainer({ container_id: containers[which] });
    }
  }, scaledMs(420_000));

  afterAll(async () => {
    if (rt !== undefined) {
      if (sandboxId !== '') {
        await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sandboxId }).catch(() => undefined);
        await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sandboxId }).catch(() => undefined);
      }
      for (const m of [submount, suidMount]) if (m !== '') await execFileAsync('umount', ['--', m]).catch(() => undefined);
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it('the container is root with CAP_MKNOD and CAP_SETFCAP: it makes a device node and a file capability in its own /dev (the control)', async () => {
    expect(await exec('private', ['id', '-u'])).toMatchObject({ code: 0, out: '0' });
    expect((await exec('private', ['mknod', '/dev/kts-null', 'c', '1', '3'])).code).toBe(0);
    expect((await exec('private', ['stat', '-c', '%F %t:%T', '/dev/kts-null'])).out).toBe('character special file 1:3');
    expect((await exec('private', ['sh', '-c', 'echo x > /dev/kts-cap && setcap cap_setuid+ep /dev/kts-cap'])).code).toBe(0);
  });

  it.each([
    ['private', 'emptyDir', '/empty', 0],
    ['private', 'hostPath', '/host', 1],
    ['private', "hostPath's tmpfs submount", '/host/sub', 1],
    ['slave', 'emptyDir', '/empty', 0],
    ['slave', 'hostPath', '/host', 1],
    ['slave', "hostPath's tmpfs submount", '/host/sub', 1],
  ] as const)('%s volume, %s: mknod fails in the guest and no device node reaches the host', async (which, _kind, guestDir, n) => {
    const name = `dev-${which}`;
    const r = await exec(which, ['mknod', `${guestDir}/${name}`, 'c', '1', '3']);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/Operation not permitted/);
    const hostDir = guestDir === '/empty' ? emptyDir : guestDir === '/host' ? hostPath : submount;
    await expect(fsp.lstat(path.join(hostDir, name))).rejects.toMatchObject({ code: 'ENOENT' });
    // The runtime's bind the guest wrote through, in its namespace: nothing there either.
    const bind = path.join(await bindPathOf(which, n), guestDir === '/host/sub' ? 'sub' : '', name);
    await expect(rt.inNamespace(['stat', '-c', '%F', bind])).rejects.toThrow();
  });

  it.each([
    ['private', 'emptyDir', '/empty'],
    ['private', "hostPath's tmpfs submount", '/host/sub'],
    ['slave', 'hostPath', '/host'],
  ] as const)('%s volume, %s: setcap (a file capability) fails in the guest and the host file has none', async (which, _kind, guestDir) => {
    const file = `${guestDir}/cap-${which}`;
    const r = await exec(which, ['sh', '-c', `echo x > ${file} && setcap ${FILE_CAP} ${file}`]);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/Operation not supported|Operation not permitted/);
    const hostDir = guestDir === '/empty' ? emptyDir : guestDir === '/host' ? hostPath : submount;
    const { stdout } = await execFileAsync('getcap', [path.join(hostDir, `cap-${which}`)]);
    expect(stdout.trim()).toBe('');
  });

  it.each([
    ['private', 'emptyDir', '/empty', 0],
    ['private', 'hostPath', '/host', 1],
    ['private', "hostPath's tmpfs submount", '/host/sub', 1],
    ['slave', 'emptyDir', '/empty', 0],
    ['slave', "hostPath's tmpfs submount", '/host/sub', 1],
  ] as const)(
    '%s volume, %s: the guest CAN leave a set-uid-root and a set-gid-root program on the host; run through the runtime bind by nobody it gets neither uid 0 nor gid 0 (nosuid), a suid-honouring copy gets both',
    async (which, _kind, guestDir, n) => {
      const suid = `suid-${which}`;
      const sgid = `sgid-${which}`;
      const made = await exec(which, [
        'sh',
        '-c',
        `cat ${guestDir}/euid-src > ${guestDir}/${suid} && cat ${guestDir}/euid-src > ${guestDir}/${sgid} && chmod 4755 ${guestDir}/${suid} && chmod 2755 ${guestDir}/${sgid}`,
      ]);
      expect(made).toMatchObject({ code: 0, err: '' });
      const hostDir = guestDir === '/empty' ? emptyDir : guestDir === '/host' ? hostPath : submount;
      // The attack reached the host directory: set-id bits on files owned by root.
      const suidStat = await fsp.stat(path.join(hostDir, suid));
      expect([suidStat.uid, suidStat.mode & S_ISUID]).toEqual([0, S_ISUID]);
      const sgidStat = await fsp.stat(path.join(hostDir, sgid));
      expect([sgidStat.gid, sgidStat.mode & S_ISGID]).toEqual([0, S_ISGID]);

      // Through the runtime's bind (the path virtiofsd serves it from): no privilege.
      const bindDir = path.join(await bindPathOf(which, n), guestDir === '/host/sub' ? 'sub' : '');
      expect(await runAsNobody(path.join(bindDir, suid), '-u', true)).toBe(String(NOBODY));
      expect(await runAsNobody(path.join(bindDir, sgid), '-g', true)).toBe(String(NOBODY));

      // The same files, copied with their modes to a mount that honours set-id bits: root.
      for (const f of [suid, sgid]) await execFileAsync('cp', ['-p', path.join(hostDir, f), path.join(suidMount, f)]);
      expect(await runAsNobody(path.join(suidMount, suid), '-u', false)).toBe('0');
      expect(await runAsNobody(path.join(suidMount, sgid), '-g', false)).toBe('0');
    },
  );

  it('every mount under the sandbox shared directory in the runtime namespace is nosuid,nodev (the volumes, their submounts, the root filesystems)', async () => {
    const sharedDir = sandboxSharedDir(rt.stateDir, sandboxId);
    const lines = (await rt.mountinfo()).split('\n').filter((l) => {
      const point = l.split(' ')[4] ?? '';
      return point === sharedDir || point.startsWith(`${sharedDir}/`);
    });
    // The share itself, and for each of the two containers its rootfs, two volumes and the copy
    // of the hostPath's submount.
    expect(lines.length).toBeGreaterThanOrEqual(9);
    for (const l of lines) {
      const flags = (l.split(' ')[5] ?? '').split(',');
      expect({ point: l.split(' ')[4], nosuid: flags.includes('nosuid'), nodev: flags.includes('nodev') }).toEqual({
        point: l.split(' ')[4],
        nosuid: true,
        nodev: true,
      });
    }
  });
});
