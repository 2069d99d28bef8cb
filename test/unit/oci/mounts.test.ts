import { describe, expect, it } from 'vitest';
import { etcFiles, etcMounts, resolveHostname } from '../../../src/oci/etc-files.js';
import type { OciGuestLayout, OciMountInput } from '../../../src/oci/input.js';
import { criMounts, standardMounts } from '../../../src/oci/mounts.js';
import { thrown } from './load.js';

const guest = (sources: Record<string, string>): OciGuestLayout => ({
  rootfsPath: '/r',
  cgroupsPath: '/c',
  mountSources: sources,
  namespaces: { network: 'n', ipc: 'i', uts: 'u', pid: 'p' },
  shmPath: '/shm',
  etcDir: '/pod/etc/',
});

describe('standard mounts', () => {
  it('proc, /dev tmpfs, devpts, mqueue, sysfs and cgroup2 read-only', () => {
    const m = standardMounts(false);
    expect(m.map((x) => [x.destination, x.type])).toEqual([
      ['/proc', 'proc'],
      ['/dev', 'tmpfs'],
      ['/dev/pts', 'devpts'],
      ['/dev/mqueue', 'mqueue'],
      ['/sys', 'sysfs'],
      ['/sys/fs/cgroup', 'cgroup2'],
    ]);
    expect(m[4]?.options).toContain('ro');
    expect(m[5]?.options).toContain('ro');
  });
  it('privileged: sysfs and cgroup writable', () => {
    const m = standardMounts(true);
    expect(m[4]?.options).not.toContain('ro');
    expect(m[5]?.options).not.toContain('ro');
  });
});

describe('CRI mounts', () => {
  const mount = (container_path: string, extra: Partial<OciMountInput> = {}): OciMountInput => ({
    container_path,
    host_path: `/host${container_path}`,
    ...extra,
  });

  it('bind from the guest source with propagation and ro/rw', () => {
    const plan = criMounts(
      {
        mounts: [
          mount('/a', { readonly: true }),
          mount('/b', { propagation: 'PROPAGATION_HOST_TO_CONTAINER' }),
          mount('/c', { propagation: 'PROPAGATION_PRIVATE' }),
        ],
      },
      guest({ '/a': '/g/a', '/b': '/g/b', '/c': '/g/c' }),
      false,
    );
    expect(plan.mounts).toEqual([
      { destination: '/a', type: 'bind', source: '/g/a', options: ['rbind', 'rprivate', 'ro'] },
      { destination: '/b', type: 'bind', source: '/g/b', options: ['rbind', 'rslave', 'rw'] },
      { destination: '/c', type: 'bind', source: '/g/c', options: ['rbind', 'rprivate', 'rw'] },
    ]);
    expect(plan.rootfsPropagation).toBe('slave');
  });
  it('recursive read-only (read-only and private): a read-only bind, the guest sees one mount', () => {
    const plan = criMounts({ mounts: [mount('/r', { readonly: true, recursive_read_only: true })] }, guest({ '/r': '/g/r' }), false);
    expect(plan.mounts).toEqual([{ destination: '/r', type: 'bind', source: '/g/r', options: ['rbind', 'rprivate', 'ro'] }]);
  });
  it("read-only, not recursive: the volume's host submounts are bound again writable over it", () => {
    const g = {
      ...guest({ '/ro': '/g/ro', '/rro': '/g/rro', '/rw': '/g/rw' }),
      mountSubmounts: { '/ro': ['a', 'a/b'], '/rro': ['x'], '/rw': ['y'] },
    };
    const plan = criMounts(
      {
        mounts: [
          mount('/ro', { readonly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' }),
          mount('/rro', { readonly: true, recursive_read_only: true }),
          mount('/rw'),
        ],
      },
      g,
      false,
    );
    expect(plan.mounts).toEqual([
      { destination: '/ro', type: 'bind', source: '/g/ro', options: ['rbind', 'rslave', 'ro'] },
      { destination: '/ro/a', type: 'bind', source: '/g/ro/a', options: ['rbind', 'rslave', 'rw'] },
      { destination: '/ro/a/b', type: 'bind', source: '/g/ro/a/b', options: ['rbind', 'rslave', 'rw'] },
      { destination: '/rro', type: 'bind', source: '/g/rro', options: ['rbind', 'rprivate', 'ro'] },
      { destination: '/rw', type: 'bind', source: '/g/rw', options: ['rbind', 'rprivate', 'rw'] },
    ]);
    const bad = { ...g, mountSubmounts: { '/ro': ['../etc'] } };
    expect(thrown(() => criMounts({ mounts: [mount('/ro', { readonly: true })] }, bad, false)).reason).toBe('OCI_MOUNT_PATH_INVALID');
  });
  it('keeps the request order, moving only a parent ahead of its children', () => {
    const paths = ['/z', '/data/logs', '/a', '/data', '/data/logs/x'];
    const plan = criMounts({ mounts: paths.map((p) => mount(p)) }, guest(Object.fromEntries(paths.map((p) => [p, `/g${p}`]))), false);
    expect(plan.mounts.map((m) => m.destination)).toEqual(['/z', '/data', '/data/logs', '/a', '/data/logs/x']);
  });
  it('bidirectional: rshared root, privileged only', () => {
    const input = { mounts: [mount('/m', { propagation: 'PROPAGATION_BIDIRECTIONAL' })] };
    expect(criMounts(input, guest({ '/m': '/g' }), true).rootfsPropagation).toBe('shared');
    expect(thrown(() => criMounts(input, guest({ '/m': '/g' }), false)).reason).toBe('OCI_MOUNT_PROPAGATION_PRIVILEGED');
  });
  it('refuses what the guest cannot give, naming the mount', () => {
    const g = guest({ '/ok': '/g/ok', '/m': '/g/m' });
    const cases: [Partial<OciMountInput>, string][] = [
      [{ container_path: 'rel' }, 'OCI_MOUNT_PATH_INVALID'],
      [{ container_path: '/a/../etc' }, 'OCI_MOUNT_PATH_INVALID'],
      [{ uidMappings: [{}] }, 'OCI_MOUNT_IDMAP_UNSUPPORTED'],
      [{ recursive_read_only: true }, 'OCI_MOUNT_RRO_INVALID'],
      [{ recursive_read_only: true, readonly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' }, 'OCI_MOUNT_RRO_INVALID'],
      [{ image: { image: 'busybox' } }, 'OCI_MOUNT_IMAGE_UNSUPPORTED'],
      [{ container_path: '/unknown' }, 'OCI_MOUNT_SOURCE_UNRESOLVED'],
    ];
    for (const [extra, reason] of cases) {
      const err = thrown(() => criMounts({ mounts: [mount('/ok'), { ...mount('/m'), ...extra }] }, g, false));
      expect(err.reason).toBe(reason);
      expect(err.message).toMatch(/^container\.mounts\[1\]/);
    }
    expect(thrown(() => criMounts({ mounts: [mount('/m'), mount('/m/')] }, g, false)).reason).toBe('OCI_MOUNT_DUPLICATE');
  });
});

describe('hostname, hosts, resolv.conf', () => {
  it('hostname must be RFC 1123; empty means none', () => {
    expect(resolveHostname({ hostname: 'web-0.example' })).toBe('web-0.example');
    expect(resolveHostname({})).toBeUndefined();
    // An FQDN may use all of Linux's 64 bytes (RunPodSandbox admits as much); one label at most 63.
    const fqdn64 = `${'a'.repeat(63)}.`.slice(0, 60) + '.b.c';
    expect(fqdn64).toHaveLength(64);
    expect(resolveHostname({ hostname: fqdn64 })).toBe(fqdn64);
    for (const bad of ['-x', 'a_b', 'x'.repeat(64), `${fqdn64}d`, 'a b'])
      expect(thrown(() => resolveHostname({ hostname: bad })).reason).toBe('OCI_HOSTNAME_INVALID');
  });
  it("resolv.conf from dns_config; no dns_config leaves the image's file", () => {
    const files = etcFiles(
      { dns_config: { servers: ['10.0.0.10', 'fd00::a'], searches: ['a.local', 'b.local'], options: ['ndots:5'] } },
      guest({}),
      'h',
      new Set(),
    );
    expect(files.map((f) => f.containerPath)).toEqual(['/etc/hostname', '/etc/hosts', '/etc/resolv.conf']);
    expect(files[2]).toEqual({
      containerPath: '/etc/resolv.conf',
      guestPath: '/pod/etc/resolv.conf',
      content: 'nameserver 10.0.0.10\nnameserver fd00::a\nsearch a.local b.local\noptions ndots:5\n',
      mode: 0o644,
    });
    expect(etcFiles({ dns_config: null }, guest({}), 'h', new Set()).map((f) => f.containerPath)).not.toContain('/etc/resolv.conf');
  });
  it('hosts maps localhost and the hostname; a request mount of a file replaces ours', () => {
    const files = etcFiles({}, guest({}), 'web', new Set(['/etc/hosts']));
    expect(files.map((f) => f.containerPath)).toEqual(['/etc/hostname']);
    const hosts = etcFiles({}, guest({}), 'web', new Set()).find((f) => f.containerPath === '/etc/hosts');
    expect(hosts?.content).toContain('127.0.0.1\tlocalhost\n');
    expect(hosts?.content).toContain('\tweb\n');
    expect(etcFiles({}, guest({}), undefined, new Set())).toEqual([]);
  });
  it('refuses a DNS entry that would inject a line', () => {
    const err = thrown(() => etcFiles({ dns_config: { servers: ['1.1.1.1\nnameserver 6.6.6.6'] } }, guest({}), 'h', new Set()));
    expect(err.reason).toBe('OCI_DNS_INVALID');
    expect(err.message).toMatch(/^sandbox\.dns_config\.servers\[0\]/);
  });
  it('etc files are mounted read-only when the root is', () => {
    const files = etcFiles({}, guest({}), 'h', new Set());
    expect(etcMounts(files, true).every((m) => m.options!.includes('ro'))).toBe(true);
    expect(etcMounts(files, false).every((m) => m.options!.includes('rw'))).toBe(true);
  });
});
