/**
 * Hostile requests against a real daemon: every request field that reaches a host path, argv,
 * the environment or CNI, set to what an attacker would send. Each is refused with
 * INVALID_ARGUMENT naming the field, and leaves nothing on the host: no directory or file (in a
 * tree the test watches, where the hostile paths point), no record, no work dir, no cgroup, no
 * process, no mount, no listing change. RunPodSandbox refusals boot nothing; the CreateContainer
 * ones share ONE real pod VM (QEMU under TCG). The log-file attacks (a symbolic link planted as
 * the log file or its directory) are refused at StartContainer, before the guest is asked.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type ServiceError, status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REASON_METADATA_KEY } from '../../../src/cri/status.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { hashedFiles } from '../../helpers/cri-fuzz.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

/**
 * Every entry under `dir`: kind, and a hash of each regular file (a FIFO is listed, never read:
 * reading one would block), link targets as they read.
 */
async function treeOf(dir: string): Promise<string[]> {
  const out: string[] = [];
  async function walk(d: string): Promise<void> {
    for (const e of await fsp.readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(d, e.name);
      const rel = path.relative(dir, p);
      if (e.isDirectory()) {
        out.push(`${rel}/`);
        await walk(p);
      } else if (e.isFile())
        out.push(
          `${rel} ${createHash('sha256')
            .update(await fsp.readFile(p))
            .digest('hex')
            .slice(0, 12)}`,
        );
      else if (e.isSymbolicLink()) out.push(`${rel} -> ${await fsp.readlink(p)}`);
      else out.push(`${rel} (special)`);
    }
  }
  await walk(dir);
  return out.sort();
}

/** The call's gRPC error (code, details, kata-ts reason), or a failure if it succeeded. */
async function refusal(call: Promise<unknown>): Promise<{ code: number; details: string; reason: string | undefined }> {
  try {
    await call;
  } catch (err) {
    const se = err as ServiceError;
    return { code: se.code, details: se.details, reason: se.metadata?.get(REASON_METADATA_KEY)?.[0]?.toString() };
  }
  throw new Error('the hostile request was accepted');
}

describe('hostile requests are refused and leave nothing behind (real daemon)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image = '';
  /** Where the hostile paths point: a victim directory with a file, links to it, a FIFO. */
  let arena = '';
  let victim = '';

  /** Everything a refused request must leave as it was. */
  async function hostState(): Promise<string> {
    const { items } = await rt.cri.runtime.ListPodSandbox({});
    const { containers } = await rt.cri.runtime.ListContainers({});
    const left = await leftovers(rt);
    return JSON.stringify(
      {
        pods: items.map((s) => `${s.id}:${s.state}`).sort(),
        containers: containers.map((c) => `${c.id}:${c.state}`).sort(),
        criRecords: [
          ...(await hashedFiles(path.join(rt.stateDir, 'sandboxes'))),
          ...(await hashedFiles(path.join(rt.stateDir, 'containers'))),
        ],
        rootfs: (await fsp.readdir(path.join(rt.stateDir, 'rootfs')).catch(() => [])).sort(),
        arena: await treeOf(arena),
        // Mounts in the runtime's own namespace: a refused create binds nothing.
        mounts: (await rt.mountinfo()).split('\n').filter((l) => l.includes(rt.dir)).length,
        ...left,
      },
      null,
      1,
    );
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'hostile/busybox', '1.0', ['sleep']);
    rt = await createTestRuntime({ logLevel: 'info', images: { registriesConfigPath: '/dev/null' } });
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    arena = path.join(rt.dir, 'arena');
    victim = path.join(arena, 'victim');
    await fsp.mkdir(victim, { recursive: true });
    await fsp.writeFile(path.join(victim, 'secret'), 'root-only\n', { mode: 0o600 });
    await fsp.symlink(victim, path.join(arena, 'dir-link'));
    await fsp.symlink(path.join(victim, 'secret'), path.join(arena, 'file-link'));
    execFileSync('mkfifo', [path.join(arena, 'fifo')]);
  }, scaledMs(180_000));

  afterAll(async () => {
    await rt?.cleanup();
    await registry?.stop();
  });

  describe('RunPodSandbox (nothing boots)', () => {
    const cases: Array<[string, (base: Record<string, unknown>) => Record<string, unknown>, string]> = [
      [
        'a pod name that splits CNI_ARGS',
        (b) => ({ ...b, metadata: { ...(b.metadata as object), name: 'x;K8S_POD_NAMESPACE=kube-system' } }),
        'config.metadata.name',
      ],
      [
        'a uid that splits CNI_ARGS',
        (b) => ({ ...b, metadata: { ...(b.metadata as object), uid: 'u;K8S_POD_NAME=other' } }),
        'config.metadata.uid',
      ],
      ['a namespace with "="', (b) => ({ ...b, metadata: { ...(b.metadata as object), namespace: 'a=b' } }), 'config.metadata.namespace'],
      ['a pod name that is a path', (b) => ({ ...b, metadata: { ...(b.metadata as object), name: '../../etc' } }), 'config.metadata.name'],
      ['a log_directory climbing out', (b) => ({ ...b, log_directory: '/var/log/pods/../../../etc/cron.d' }), 'config.log_directory'],
      ['a log_directory not normalised', (b) => ({ ...b, log_directory: `${arena}//pods/./x` }), 'config.log_directory'],
      ['a relative log_directory', (b) => ({ ...b, log_directory: 'var/log/pods/x' }), 'config.log_directory'],
      [
        'a log_directory through a symbolic link',
        (b) => ({ ...b, log_directory: path.join(arena, 'dir-link', 'pod') }),
        'config.log_directory',
      ],
      [
        'an unknown port protocol',
        (b) => ({ ...b, port_mappings: [{ protocol: 7, container_port: 80, host_port: 8080 }] }),
        'config.port_mappings[0].protocol',
      ],
      [
        'a host port past 65535',
        (b) => ({ ...b, port_mappings: [{ container_port: 80, host_port: 70_000 }] }),
        'config.port_mappings[0].host_port',
      ],
      [
        'a host_ip that is not an address',
        (b) => ({ ...b, port_mappings: [{ container_port: 80, host_port: 8080, host_ip: '0.0.0.0 -j ACCEPT' }] }),
        'config.port_mappings[0].host_ip',
      ],
      [
        'a DNS search line that injects a nameserver',
        (b) => ({ ...b, dns_config: { servers: [], searches: ['a\nnameserver 6.6.6.6'], options: [] } }),
        'config.dns_config.searches[0]',
      ],
      [
        'a DNS server that is no address',
        (b) => ({ ...b, dns_config: { servers: ['evil.example'], searches: [], options: [] } }),
        'config.dns_config.servers[0]',
      ],
      [
        'a sysctl that is a path',
        (b) => ({ ...b, linux: { ...(b.linux as object), sysctls: { '../../proc/sysrq-trigger': 'c' } } }),
        'config.linux.sysctls',
      ],
      ['a hostname with a separator', (b) => ({ ...b, hostname: 'a;b' }), 'config.hostname'],
      [
        'a cgroup_parent climbing out',
        (b) => ({ ...b, linux: { ...(b.linux as object), cgroup_parent: '/kubepods/../../../sys/fs/cgroup' } }),
        'cgroup_parent',
      ],
    ];

    it.each(cases)('%s', async (_what, edit, field) => {
      const before = await hostState();
      const out = await refusal(rt.cri.runtime.RunPodSandbox({ config: edit(podConfig(rt, 'hostile-pod')) }));
      expect(status[out.code], out.details).toBe('INVALID_ARGUMENT');
      expect(out.details).toContain(field);
      expect(await hostState()).toBe(before);
      expect((await leftovers(rt)).processes).toEqual([]);
    });
  });

  describe('CreateContainer and StartContainer in one real pod', () => {
    let sid = '';
    let sandboxConfig: Record<string, unknown> = {};
    let logDir = '';
    const container = (name: string, extra: Record<string, unknown> = {}) => ({
      metadata: { name, attempt: 0 },
      image: { image },
      command: ['sleep', '100000'],
      log_path: `${name}/0.log`,
      ...extra,
    });

    beforeAll(async () => {
      logDir = path.join(rt.dir, 'pod-logs');
      await fsp.mkdir(logDir);
      sandboxConfig = { ...podConfig(rt, 'hostile-requests'), log_directory: logDir };
      sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
    }, scaledMs(300_000));

    const cases: Array<[string, () => Record<string, unknown>, string]> = [
      ['a container name that splits CNI_ARGS', () => container('app;K8S_POD_NAME=x'), 'config.metadata.name'],
      ['an absolute log_path', () => container('abs', { log_path: '/etc/cron.d/x' }), 'config.log_path'],
      ['a log_path climbing out', () => container('up', { log_path: '../../../../etc/x.log' }), 'config.log_path'],
      [
        'a missing host_path, then a FIFO (the first must not be made)',
        () =>
          container('m1', {
            mounts: [
              { container_path: '/a', host_path: path.join(arena, 'made-by-m1', 'deep') },
              { container_path: '/b', host_path: path.join(arena, 'fifo') },
            ],
          }),
        'container.mounts[1]',
      ],
      [
        'a missing host_path, then a relative one',
        () =>
          container('m2', {
            mounts: [
              { container_path: '/a', host_path: path.join(arena, 'made-by-m2') },
              { container_path: '/b', host_path: 'relative/dir' },
            ],
          }),
        'container.mounts[1]',
      ],
      [
        'a host_path with ".."',
        () => container('m3', { mounts: [{ container_path: '/a', host_path: `${arena}/made-by-m3/../victim` }] }),
        'container.mounts[0]',
      ],
      [
        'a host_path below a file',
        () =>
          container('m4', {
            mounts: [
              { container_path: '/a', host_path: path.join(arena, 'made-by-m4') },
              { container_path: '/b', host_path: path.join(victim, 'secret', 'below') },
            ],
          }),
        'container.mounts[1]',
      ],
      [
        'a mount propagation the CRI does not name',
        () => container('p1', { mounts: [{ container_path: '/a', host_path: path.join(arena, 'made-by-p1'), propagation: 7 }] }),
        'config.mounts[0].propagation',
      ],
      [
        'a Localhost seccomp profile that is a FIFO',
        () =>
          container('s1', {
            linux: { security_context: { seccomp: { profile_type: 'Localhost', localhost_ref: path.join(arena, 'fifo') } } },
          }),
        'seccomp',
      ],
      [
        'a Localhost seccomp profile path with ".."',
        () =>
          container('s2', {
            linux: { security_context: { seccomp: { profile_type: 'Localhost', localhost_ref: `${arena}/x/../victim/secret` } } },
          }),
        'seccomp',
      ],
    ];

    it.each(cases)(
      '%s',
      async (_what, config, field) => {
        const before = await hostState();
        const out = await refusal(rt.cri.runtime.CreateContainer({ pod_sandbox_id: sid, config: config(), sandbox_config: sandboxConfig }));
        expect(status[out.code], out.details).toBe('INVALID_ARGUMENT');
        expect(out.details).toContain(field);
        expect(await hostState()).toBe(before);
        expect(await fsp.readdir(arena)).toEqual(expect.not.arrayContaining([expect.stringMatching(/^made-by/)]));
      },
      scaledMs(60_000),
    );

    it.each([
      [
        'the log file is a link to a host file',
        'file-link',
        () => fsp.symlink(path.join(victim, 'secret'), path.join(logDir, 'file-link', '0.log')),
      ],
      ['the log directory is a link to a host directory', 'dir-link', () => fsp.symlink(victim, path.join(logDir, 'dir-link'))],
    ])(
      'StartContainer refuses a log path where %s, writing nothing there',
      async (_what, name, plant) => {
        await fsp.mkdir(path.join(logDir, 'file-link'), { recursive: true });
        await plant();
        const id = (await rt.cri.runtime.CreateContainer({ pod_sandbox_id: sid, config: container(name), sandbox_config: sandboxConfig }))
          .container_id;
        try {
          const out = await refusal(rt.cri.runtime.StartContainer({ container_id: id }));
          expect(status[out.code], out.details).toBe('FAILED_PRECONDITION');
          expect(out.reason).toBe('LOGS_PATH_UNUSABLE');
          expect(await fsp.readdir(victim)).toEqual(['secret']);
          expect(await fsp.readFile(path.join(victim, 'secret'), 'utf8')).toBe('root-only\n');
          const { status: st } = await rt.cri.runtime.ContainerStatus({ container_id: id });
          expect(st?.state).toBe('CONTAINER_CREATED');
        } finally {
          await rt.cri.runtime.RemoveContainer({ container_id: id });
        }
      },
      scaledMs(120_000),
    );

    it(
      'the pod still serves: a well-formed container with a missing host_path starts, and its directory is made',
      async () => {
        const source = path.join(arena, 'made-for-ok');
        const id = (
          await rt.cri.runtime.CreateContainer({
            pod_sandbox_id: sid,
            config: container('ok', { mounts: [{ container_path: '/data', host_path: source }] }),
            sandbox_config: sandboxConfig,
          })
        ).container_id;
        try {
          expect((await fsp.stat(source)).isDirectory()).toBe(true);
          await rt.cri.runtime.StartContainer({ container_id: id });
          expect((await fsp.stat(path.join(logDir, 'ok', '0.log'))).isFile()).toBe(true);
        } finally {
          await rt.cri.runtime.StopContainer({ container_id: id, timeout: 0 });
          await rt.cri.runtime.RemoveContainer({ container_id: id });
        }
      },
      scaledMs(180_000),
    );
  });
});
