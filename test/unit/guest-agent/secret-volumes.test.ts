/**
 * The agent's secret volumes: the pure plan (checks, file names, owner, OCI mounts) and the
 * execution against a temporary root. mount/umount are /bin/true here and the mount table a file
 * of the test's (a unit test mounts nothing on the host); the real tmpfs is exercised in the
 * guest by test/integration/attest/pod-secrets.test.ts.
 */
import { existsSync, linkSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import '../../../guest/agent/attest/reasons.js';
import {
  mapId,
  planSecretVolume,
  type SecretSource,
  SecretVolumes,
  secretMounts,
  secretVolumeSizeBytes,
} from '../../../guest/agent/secret-volumes.js';
import { precondition, unavailable } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'agent-secrets-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const spec = (extra: Record<string, unknown> = {}) => ({
  process: { user: { uid: 1000, gid: 2000 }, args: ['sh'] },
  mounts: [{ destination: '/proc', type: 'proc', source: 'proc' }],
  ...extra,
});
const one = [{ resource: 'default/db/password', containerPath: '/run/secrets/db-password' }];

describe('planSecretVolume', () => {
  it('names a file per secret in the container own directory, owned by the container user', () => {
    const plan = planSecretVolume(
      '/run/kata-ts/secrets',
      'c1',
      [...one, { resource: 'default/tls/key', containerPath: '/etc/tls/key.pem' }],
      spec(),
    );
    expect(plan).toEqual({
      dir: '/run/kata-ts/secrets/c1',
      secrets: [
        { resource: 'default/db/password', containerPath: '/run/secrets/db-password', file: '/run/kata-ts/secrets/c1/secret-0' },
        { resource: 'default/tls/key', containerPath: '/etc/tls/key.pem', file: '/run/kata-ts/secrets/c1/secret-1' },
      ],
      owner: { uid: 1000, gid: 2000 },
    });
    expect(secretMounts(plan)[0]).toEqual({
      destination: '/run/secrets/db-password',
      type: 'bind',
      source: '/run/kata-ts/secrets/c1/secret-0',
      options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'],
    });
  });

  it("maps the owner through the container's user namespace; root without a user", () => {
    const mapped = spec({
      linux: {
        uidMappings: [{ containerID: 0, hostID: 100000, size: 65536 }],
        gidMappings: [{ containerID: 0, hostID: 200000, size: 65536 }],
      },
    });
    expect(planSecretVolume('/r', 'c', one, mapped).owner).toEqual({ uid: 101000, gid: 202000 });
    expect(planSecretVolume('/r', 'c', one, { mounts: [] }).owner).toEqual({ uid: 0, gid: 0 });
    expect(() => mapId(5, [{ containerID: 10, hostID: 0, size: 1 }])).toThrow(/user 5 is not mapped/);
  });

  const bad: Array<[string, string, Parameters<typeof planSecretVolume>[2], Record<string, unknown>, RegExp]> = [
    ['a container id that is a path', '../x', one, spec(), /container_id "..\/x" cannot name/],
    ['a bad resource', 'c', [{ resource: '../etc/passwd', containerPath: '/s' }], spec(), /secrets\[0\]\.resource/],
    ['a relative path', 'c', [{ resource: 'a/b/c', containerPath: 's' }], spec(), /secrets\[0\]\.container_path "s" is not absolute/],
    ['a traversing path', 'c', [{ resource: 'a/b/c', containerPath: '/a/../b' }], spec(), /has a '.' or '..' segment/],
    ['a directory', 'c', [{ resource: 'a/b/c', containerPath: '/a/' }], spec(), /names no file/],
    ['a path under /proc', 'c', [{ resource: 'a/b/c', containerPath: '/proc/x' }], spec(), /under \/proc, \/sys or \/dev/],
    [
      "a path over the spec's own mount",
      'c',
      [{ resource: 'a/b/c', containerPath: '/data/s' }],
      spec({ mounts: [{ destination: '/data', type: 'bind', source: '/x' }] }),
      /overlaps the spec's mount at \/data/,
    ],
    [
      'two secrets at one path',
      'c',
      [
        { resource: 'a/b/c', containerPath: '/s' },
        { resource: 'a/b/d', containerPath: '/s' },
      ],
      spec(),
      /secrets\[1\]\.container_path "\/s" overlaps secrets\[0\]'s/,
    ],
    ['too many', 'c', Array.from({ length: 17 }, (_, i) => ({ resource: 'a/b/c', containerPath: `/s${i}` })), spec(), /17 entries/],
  ];
  it.each(bad)('refuses %s (SECRET_REQUEST_INVALID naming the entry)', (_what, id, secrets, s, message) => {
    expect(() => planSecretVolume('/r', id, secrets, s)).toThrow(message);
    try {
      planSecretVolume('/r', id, secrets, s);
    } catch (err) {
      expect(err).toMatchObject({ reason: expect.stringMatching(/^(SECRET_REQUEST_INVALID|ATTEST_RESOURCE_PATH_INVALID)$/) });
    }
  });

  it('sizes the tmpfs in whole pages', () => {
    expect(secretVolumeSizeBytes([Buffer.alloc(1), Buffer.alloc(4097)])).toBe(4096 + 4096 + 4096 + 8192 + 4096);
  });
});

describe('SecretVolumes', () => {
  let n = 0;
  function volumes(source: SecretSource | undefined) {
    const root = path.join(tmp, `root-${++n}`);
    const procRoot = path.join(tmp, `proc-${n}`);
    mkdirSync(path.join(procRoot, 'self'), { recursive: true });
    writeFileSync(path.join(procRoot, 'self/mountinfo'), '');
    const v = new SecretVolumes(silentLogger(), () => source, { root, mount: '/bin/true', umount: '/bin/true', procRoot });
    /** Make the test's mount table say `dir` is mounted (as the real tmpfs would be). */
    const mounted = (dir: string) => writeFileSync(path.join(procRoot, 'self/mountinfo'), `30 20 0:40 / ${dir} rw - tmpfs x rw\n`);
    return { v, root, mounted };
  }
  const secret = Buffer.from('s3cr3t-db-password');
  const granting: SecretSource = {
    resource: async (name) => (name === 'default/db/password' ? Buffer.from(secret) : Buffer.from('other')),
  };

  it('writes each resource 0400 for the container user and adds its read-only bind mount', async () => {
    const { v, root } = volumes(granting);
    const out = await v.prepare('c1', one, spec());
    const file = path.join(root, 'c1', 'secret-0');
    expect(readFileSync(file)).toEqual(secret);
    const st = statSync(file);
    expect(st.mode & 0o777).toBe(0o400);
    expect({ uid: st.uid, gid: st.gid }).toEqual({ uid: 1000, gid: 2000 });
    expect(statSync(path.join(root, 'c1')).mode & 0o777).toBe(0o700);
    expect(out.mounts).toEqual([
      { destination: '/proc', type: 'proc', source: 'proc' },
      { destination: '/run/secrets/db-password', type: 'bind', source: file, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] },
    ]);
    expect(out.process).toEqual(spec().process);
  });

  it('fails naming the resource and the broker reason, and leaves nothing, when the broker refuses', async () => {
    const refusing: SecretSource = {
      resource: async (name) => {
        if (name === 'default/db/password') return Buffer.from(secret);
        throw precondition('ATTEST_RESOURCE_REFUSED', `the broker refused resource ${name}: tpm_pcr8 does not match reference "app"`);
      },
    };
    const { v, root } = volumes(refusing);
    const two = [...one, { resource: 'default/tls/key', containerPath: '/etc/key' }];
    await expect(v.prepare('c2', two, spec())).rejects.toMatchObject({
      kind: 'precondition',
      reason: 'SECRET_RESOURCE_REFUSED',
      message: expect.stringMatching(/^resource kbs:\/\/\/default\/tls\/key for \/etc\/key was not released: .*tpm_pcr8 does not match/),
      details: { resource: 'default/tls/key', containerPath: '/etc/key', cause: 'ATTEST_RESOURCE_REFUSED' },
    });
    // Fetched before anything is made: not even the root directory exists.
    expect(existsSync(root)).toBe(false);
  });

  it('says unavailable when the broker cannot be reached, and refuses with no attester', async () => {
    const down: SecretSource = {
      resource: async () => {
        throw unavailable('ATTEST_BROKER_UNREACHABLE', 'connect ECONNREFUSED 10.88.0.1:8443');
      },
    };
    await expect(volumes(down).v.prepare('c3', one, spec())).rejects.toMatchObject({
      kind: 'unavailable',
      reason: 'SECRET_RESOURCE_UNAVAILABLE',
      message: expect.stringContaining('resource kbs:///default/db/password for /run/secrets/db-password: the broker could not be asked'),
    });
    await expect(volumes(undefined).v.prepare('c4', one, spec())).rejects.toMatchObject({ reason: 'SECRET_NO_ATTESTER' });
  });

  it('refuses a container whose volume exists, and wipes it with zeros before removing it', async () => {
    const { v, root, mounted } = volumes(granting);
    await v.prepare('c5', one, spec());
    const dir = path.join(root, 'c5');
    mounted(dir);
    await expect(v.prepare('c5', one, spec())).rejects.toMatchObject({ reason: 'SECRET_VOLUME_EXISTS' });
    // A second name for the file shows what its pages hold after the wipe.
    const witness = path.join(tmp, `witness-${n}`);
    linkSync(path.join(dir, 'secret-0'), witness);
    await v.remove('c5');
    expect(readFileSync(witness)).toEqual(Buffer.alloc(secret.length));
    expect(readdirSync(root)).toEqual([]);
    await v.remove('c5');
    await v.removeAll();
  });

  it('removeAll takes every container volume away', async () => {
    const { v, root } = volumes(granting);
    await v.prepare('a', one, spec());
    await v.prepare('b', one, spec());
    await v.removeAll();
    expect(readdirSync(root)).toEqual([]);
  });
});
