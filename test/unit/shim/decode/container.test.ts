import { describe, expect, it } from 'vitest';
import { parseLocalhostProfile } from '../../../../src/oci/seccomp-localhost.js';
import { decodeTaskContainerSpec, isSandboxFile } from '../../../../src/shim/decode/index.js';
import { thrown } from '../../../helpers/kata-error.js';
import { type EditableJson, edited, loadConfig } from './fixtures.js';

const CONTAINER = 'containerd/1.6.20/container.config.synthetic.json';
const DEVICE = 'containerd/1.6.20/container-device.config.synthetic.json';
const PRIVILEGED = 'containerd/1.6.20/container-privileged.config.synthetic.json';
const CRIO_CONTAINER = 'cri-o/1.28/container.config.synthetic.json';
const SB = '4f3c1a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7';
const CRIO_SB = '7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f';

describe('isSandboxFile: the pod files the guest replaces', () => {
  it.each([
    ['/etc/hosts', `/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/hosts`, true],
    ['/etc/hostname', `/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/hostname`, true],
    ['/etc/resolv.conf', `/srv/containerd/root/io.containerd.grpc.v1.cri/sandboxes/${SB}/resolv.conf`, true],
    ['/dev/shm', `/run/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/shm`, true],
    ['/dev/shm/', `/run/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/shm/`, true],
    ['/etc/resolv.conf', `/var/run/containers/storage/overlay-containers/${SB}/userdata/resolv.conf`, true],
    // the kubelet's own /etc/hosts, another pod's file, a file of another name, another destination
    ['/etc/hosts', '/var/lib/kubelet/pods/8d2b6a8e/etc-hosts', false],
    ['/etc/hosts', '/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/0000/hosts', false],
    ['/etc/hosts', `/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/hostname`, false],
    ['/data/hosts', `/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/hosts`, false],
  ])('%s from %s: %s', (destination, source, expected) => {
    expect(isSandboxFile(destination, source, SB)).toBe(expected);
  });
});

describe('decodeTaskContainerSpec: where each value comes from', () => {
  it('keeps a kubelet-managed /etc/hosts and drops the sandbox files and kernel filesystems', () => {
    const spec = decodeTaskContainerSpec(loadConfig(CONTAINER), SB);
    const paths = spec.mounts.map((m) => m.container_path);
    expect(paths).toContain('/etc/hosts');
    expect(paths).not.toContain('/etc/hostname');
    expect(paths).not.toContain('/etc/resolv.conf');
    expect(paths).not.toContain('/dev/shm');
    expect(paths.filter((p) => p.startsWith('/proc') || p.startsWith('/sys') || p === '/dev' || p.startsWith('/dev/pts'))).toEqual([]);
  });

  it("drops containerd's own /etc/hosts (the kubelet mounted none)", () => {
    const oci = edited(CONTAINER, (o) => {
      o.mounts = o.mounts.map((m: EditableJson) =>
        m.destination === '/etc/hosts' ? { ...m, source: `/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/${SB}/hosts` } : m,
      );
    });
    expect(decodeTaskContainerSpec(oci, SB).mounts.map((m) => m.container_path)).not.toContain('/etc/hosts');
  });

  it('reads mount options: the last ro/rw, rro, propagation, id mappings, bind by option', () => {
    const oci = edited(CONTAINER, (o) => {
      o.mounts = [
        { destination: '/a', type: 'none', source: '/host/a', options: ['bind', 'ro', 'rw', 'rshared'] },
        { destination: '/b', source: '/host/b', options: ['rbind', 'rro', 'rprivate'] },
        {
          destination: '/c',
          type: 'bind',
          source: '/host/c',
          options: ['rbind', 'slave'],
          uidMappings: [{ containerID: 0, hostID: 1000, size: 1 }],
        },
      ];
    });
    const mounts = decodeTaskContainerSpec(oci, SB).mounts;
    expect(mounts.map((m) => [m.container_path, m.readonly, m.recursive_read_only, m.propagation])).toEqual([
      ['/a', false, false, 'PROPAGATION_BIDIRECTIONAL'],
      ['/b', true, true, 'PROPAGATION_PRIVATE'],
      ['/c', false, false, 'PROPAGATION_HOST_TO_CONTAINER'],
    ]);
    expect(mounts[2]?.uidMappings).toEqual([{ host_id: 1000, container_id: 0, length: 1 }]);
  });

  it("asks the caller for a device's host node when it can tell", () => {
    const spec = decodeTaskContainerSpec(loadConfig(DEVICE), SB, {
      hostDevicePath: (d) => (d.major === 243 ? `/dev/vfio/host-${d.minor}` : undefined),
    });
    expect(spec.devices).toEqual([
      { container_path: '/dev/vfio/42', host_path: '/dev/vfio/host-0', permissions: 'rw' },
      { container_path: '/dev/vfio/vfio', host_path: '/dev/vfio/vfio', permissions: 'rwm' },
    ]);
  });

  it('takes stdin from the caller (containerd) or the Stdin annotations (CRI-O)', () => {
    expect(decodeTaskContainerSpec(loadConfig(CONTAINER), SB).stdin).toBe(false);
    expect(decodeTaskContainerSpec(loadConfig(CONTAINER), SB, { stdin: true }).stdin).toBe(true);
    const crio = edited(CRIO_CONTAINER, (o) => {
      o.annotations['io.kubernetes.cri-o.Stdin'] = 'true';
      o.annotations['io.kubernetes.cri-o.StdinOnce'] = 'true';
    });
    const spec = decodeTaskContainerSpec(crio, CRIO_SB);
    expect([spec.stdin, spec.stdin_once]).toEqual([true, true]);
  });

  it('a spec without capabilities grants none; ambient ones are kept', () => {
    const none = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => delete o.process.capabilities),
      SB,
    );
    expect(none.linux?.security_context?.capabilities).toEqual({
      add_capabilities: [],
      drop_capabilities: ['ALL'],
      add_ambient_capabilities: [],
    });
    const ambient = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => (o.process.capabilities = { bounding: ['CAP_NET_BIND_SERVICE'], ambient: ['CAP_NET_BIND_SERVICE'] })),
      SB,
    );
    expect(ambient.linux?.security_context?.capabilities?.add_ambient_capabilities).toEqual(['NET_BIND_SERVICE']);
  });

  it("passes the spec's seccomp filter on as a Localhost profile when the caller wrote it to a file", () => {
    const oci = loadConfig(CONTAINER) as { linux: { seccomp: unknown } };
    const given = decodeTaskContainerSpec(oci, SB, { seccompProfilePath: '/bundle/kata-ts-seccomp.json' });
    expect(given.linux?.security_context?.seccomp).toEqual({ profile_type: 'Localhost', localhost_ref: '/bundle/kata-ts-seccomp.json' });
    // The filter containerd writes is one the core's Localhost profile reader takes as it is.
    expect(parseLocalhostProfile(JSON.stringify(oci.linux.seccomp), 'seccomp', []).defaultAction).toBe('SCMP_ACT_ERRNO');
    expect(decodeTaskContainerSpec(oci, SB).linux?.security_context?.seccomp).toEqual({
      profile_type: 'RuntimeDefault',
      localhost_ref: '',
    });
    const none = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => delete o.linux.seccomp),
      SB,
      { seccompProfilePath: '/bundle/kata-ts-seccomp.json' },
    );
    expect(none.linux?.security_context?.seccomp).toEqual({ profile_type: 'Unconfined', localhost_ref: '' });
  });

  it('a user namespace reads as userns POD (which the guest spec builder refuses)', () => {
    const spec = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => o.linux.namespaces.push({ type: 'user', path: '/proc/4242/ns/user' })),
      SB,
    );
    expect(spec.linux?.security_context?.namespace_options?.userns_options?.mode).toBe('POD');
  });

  it('has no linux.resources when the spec has neither resources nor an OOM score', () => {
    const spec = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => {
        delete o.linux.resources;
        delete o.process.oomScoreAdj;
      }),
      SB,
    );
    expect(spec.linux?.resources).toBeNull();
  });

  it('a privileged container behind privileged_without_host_devices (no allow-all device rule) is still privileged', () => {
    // What containerd writes for a privileged container when the runtime sets
    // privileged_without_host_devices (as `kata-ts install` does): WithPrivileged, no device rule.
    const withoutRule = (o: EditableJson) => {
      o.linux.resources.devices = [{ allow: false, access: 'rwm' }];
      o.linux.devices = [];
    };
    const privileged = (edit: (o: EditableJson) => void) =>
      decodeTaskContainerSpec(edited(PRIVILEGED, edit), SB).linux?.security_context?.privileged;
    expect(privileged(() => undefined)).toBe(true);
    expect(privileged(withoutRule)).toBe(true);
    // Each of WithPrivileged's marks is needed: sysfs or cgroupfs read-only, a masked or read-only
    // path, no CAP_SYS_ADMIN, or no sysfs at all is a container that is not privileged.
    const sysfs = (o: EditableJson) => o.mounts.find((m: { type: string }) => m.type === 'sysfs');
    for (const [what, edit] of [
      ['sysfs ro', (o: EditableJson) => sysfs(o).options.push('ro')],
      ['sysfs rro', (o: EditableJson) => sysfs(o).options.push('rro')],
      ['cgroupfs ro', (o: EditableJson) => o.mounts.find((m: { type: string }) => m.type === 'cgroup').options.push('ro')],
      ['a masked path', (o: EditableJson) => (o.linux.maskedPaths = ['/proc/kcore'])],
      ['a read-only path', (o: EditableJson) => (o.linux.readonlyPaths = ['/proc/sys'])],
      [
        'no CAP_SYS_ADMIN',
        (o: EditableJson) =>
          (o.process.capabilities.bounding = o.process.capabilities.bounding.filter((c: string) => c !== 'CAP_SYS_ADMIN')),
      ],
      ['no sysfs', (o: EditableJson) => (o.mounts = o.mounts.filter((m: { type: string }) => m.type !== 'sysfs'))],
    ] as const) {
      expect([
        what,
        privileged((o) => {
          withoutRule(o);
          edit(o);
        }),
      ]).toEqual([what, false]);
    }
    // An ordinary container with every capability added is not privileged either (sysfs is ro).
    const allCaps = decodeTaskContainerSpec(
      edited(CONTAINER, (o) => {
        o.process.capabilities.bounding = (edited(PRIVILEGED, () => undefined).process as EditableJson).capabilities.bounding;
        o.linux.maskedPaths = [];
        o.linux.readonlyPaths = [];
      }),
      SB,
    );
    expect(allCaps.linux?.security_context?.privileged).toBe(false);
  });

  it('names CRI-O containers from the kubelet label when Metadata is absent', () => {
    const spec = decodeTaskContainerSpec(
      edited(CRIO_CONTAINER, (o) => delete o.annotations['io.kubernetes.cri-o.Metadata']),
      CRIO_SB,
    );
    expect(spec.metadata).toEqual({ name: 'nginx', attempt: 0 });
    expect(spec.image.image).toBe('docker.io/library/nginx:1.25');
  });
});

/** [what, fixture, edit, reason, the start of the message]. */
const refusals: Array<[string, string, (o: EditableJson) => void, string, string]> = [
  [
    'no container name',
    CONTAINER,
    (o) => delete o.annotations['io.kubernetes.cri.container-name'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.container-name"] is missing',
  ],
  [
    'no image name',
    CONTAINER,
    (o) => delete o.annotations['io.kubernetes.cri.image-name'],
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri.image-name"] is missing',
  ],
  [
    'an empty image name',
    CONTAINER,
    (o) => (o.annotations['io.kubernetes.cri.image-name'] = ''),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri.image-name"] must not be empty',
  ],
  [
    'a name with a control character',
    CONTAINER,
    (o) => (o.annotations['io.kubernetes.cri.container-name'] = 'nginx\n'),
    'CONTAINER_METADATA_INVALID',
    'annotations["io.kubernetes.cri.container-name"] holds a control character',
  ],
  [
    "another pod's container",
    CONTAINER,
    (o) => (o.annotations['io.kubernetes.cri.sandbox-id'] = 'ffff'),
    'SHIM_SANDBOX_MISMATCH',
    'annotations["io.kubernetes.cri.sandbox-id"] names sandbox ffff, but this shim runs sandbox',
  ],
  [
    "the sandbox's config",
    CONTAINER,
    (o) => (o.annotations['io.kubernetes.cri.container-type'] = 'sandbox'),
    'SHIM_CONTAINER_TYPE_MISMATCH',
    'annotations["io.kubernetes.cri.container-type"] is "sandbox"',
  ],
  ['no process', CONTAINER, (o) => delete o.process, 'SHIM_SPEC_INVALID', 'process is missing'],
  ['empty args', CONTAINER, (o) => (o.process.args = []), 'SHIM_SPEC_INVALID', 'process.args must not be empty'],
  ['args that are not strings', CONTAINER, (o) => (o.process.args = ['nginx', 1]), 'SHIM_SPEC_INVALID', 'process.args[1] must be string'],
  ['no cwd', CONTAINER, (o) => delete o.process.cwd, 'SHIM_SPEC_INVALID', "process must have required property 'cwd'"],
  ['no user', CONTAINER, (o) => delete o.process.user, 'SHIM_SPEC_INVALID', "process must have required property 'user'"],
  ['a negative uid', CONTAINER, (o) => (o.process.user.uid = -1), 'SHIM_SPEC_INVALID', 'process.user.uid must be >= 0'],
  [
    'a gid beyond 32 bits',
    CONTAINER,
    (o) => (o.process.user.additionalGids = [2 ** 32]),
    'SHIM_SPEC_INVALID',
    'process.user.additionalGids[0] must be <= 4294967295',
  ],
  ['an env entry without "="', CONTAINER, (o) => o.process.env.push('JUSTAKEY'), 'SHIM_ENV_INVALID', 'process.env[9] is not KEY=VALUE'],
  ['an env entry without a key', CONTAINER, (o) => (o.process.env = ['=value']), 'SHIM_ENV_INVALID', 'process.env[0] is not KEY=VALUE'],
  [
    'an OOM score beyond 1000',
    CONTAINER,
    (o) => (o.process.oomScoreAdj = 1001),
    'SHIM_SPEC_INVALID',
    'process.oomScoreAdj must be <= 1000',
  ],
  [
    'an NFS mount',
    CONTAINER,
    (o) => o.mounts.push({ destination: '/data', type: 'nfs', source: 'server:/export' }),
    'SHIM_MOUNT_UNSUPPORTED',
    'mounts[14] mounts a "nfs" filesystem at "/data"',
  ],
  [
    'a bind mount without a source',
    CONTAINER,
    (o) => o.mounts.push({ destination: '/data', type: 'bind', options: ['rbind'] }),
    'SHIM_SPEC_INVALID',
    'mounts[14].source must name the host path',
  ],
  [
    'a mount without a destination',
    CONTAINER,
    (o) => o.mounts.push({ type: 'bind', source: '/x' }),
    'SHIM_SPEC_INVALID',
    "mounts[14] must have required property 'destination'",
  ],
  [
    'mount options that are no list',
    CONTAINER,
    (o) => (o.mounts[0].options = 'ro'),
    'SHIM_SPEC_INVALID',
    'mounts[0].options must be array',
  ],
  [
    'a device no rule allows',
    DEVICE,
    (o) => (o.linux.resources.devices = [{ allow: false, access: 'rwm' }]),
    'SHIM_SPEC_INVALID',
    'linux.devices[0] (/dev/vfio/42) has no rule allowing it',
  ],
  [
    'a device rule that allows nothing for it',
    DEVICE,
    (o) => o.linux.resources.devices.push({ allow: false, type: 'c', major: 243, minor: 0, access: 'rwm' }),
    'SHIM_SPEC_INVALID',
    'linux.devices[0] (/dev/vfio/42) has no rule allowing it',
  ],
  [
    'a device of an unknown type',
    DEVICE,
    (o) => (o.linux.devices[0].type = 'x'),
    'SHIM_SPEC_INVALID',
    'linux.devices[0].type must be one of',
  ],
  [
    'a memory limit as a string',
    CONTAINER,
    (o) => (o.linux.resources.memory.limit = '256Mi'),
    'SHIM_SPEC_INVALID',
    'linux.resources.memory.limit must be integer',
  ],
  [
    'a fractional CPU quota',
    CONTAINER,
    (o) => (o.linux.resources.cpu.quota = 1.5),
    'SHIM_SPEC_INVALID',
    'linux.resources.cpu.quota must be integer',
  ],
  [
    'a hugepage limit without a page size',
    DEVICE,
    (o) => delete o.linux.resources.hugepageLimits[0].pageSize,
    'SHIM_SPEC_INVALID',
    "linux.resources.hugepageLimits[0] must have required property 'pageSize'",
  ],
  [
    'an annotation key that is no qualified name',
    CONTAINER,
    (o) => (o.annotations['not/a/key'] = 'x'),
    'ANNOTATION_KEY_INVALID',
    'annotations key "not/a/key"',
  ],
  [
    'CRI-O with no name',
    CRIO_CONTAINER,
    (o) => {
      delete o.annotations['io.kubernetes.cri-o.Metadata'];
      delete o.annotations['io.kubernetes.container.name'];
    },
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri-o.Metadata"] has no name, and annotations["io.kubernetes.container.name"] is missing',
  ],
  [
    'CRI-O with no image',
    CRIO_CONTAINER,
    (o) => {
      delete o.annotations['io.kubernetes.cri-o.Image'];
      delete o.annotations['io.kubernetes.cri-o.ImageName'];
    },
    'SHIM_ANNOTATION_MISSING',
    'annotations["io.kubernetes.cri-o.Image"] is missing',
  ],
  [
    'a CRI-O Stdin that is no boolean',
    CRIO_CONTAINER,
    (o) => (o.annotations['io.kubernetes.cri-o.Stdin'] = '1'),
    'SHIM_ANNOTATION_INVALID',
    'annotations["io.kubernetes.cri-o.Stdin"] must be "true" or "false"',
  ],
];

describe('decodeTaskContainerSpec refusals: INVALID_ARGUMENT naming the annotation or field', () => {
  it.each(refusals)('%s', (_what, fixture, edit, reason, start) => {
    const sandboxId = fixture === CRIO_CONTAINER ? CRIO_SB : SB;
    const err = thrown(() => decodeTaskContainerSpec(edited(fixture, edit), sandboxId));
    expect(err.kind).toBe('invalid');
    expect(err.reason).toBe(reason);
    expect(err.message.startsWith(start), err.message).toBe(true);
  });
});
