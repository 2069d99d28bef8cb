/**
 * The pod request fields that reach CNI or the files the runtime writes (src/runtime/spec/sandbox-fields.ts,
 * through decodeSandboxSpec): what the kubelet and critest send passes, a hostile value is refused
 * with INVALID_ARGUMENT naming the field.
 */
import { describe, expect, it } from 'vitest';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { CreateContainerRequest__Output } from '../../../src/generated/runtime/v1/CreateContainerRequest.js';
import type { PortMapping__Output } from '../../../src/generated/runtime/v1/PortMapping.js';
import type { RunPodSandboxRequest__Output } from '../../../src/generated/runtime/v1/RunPodSandboxRequest.js';
import { decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import { checkLogDirectory, checkLogPath } from '../../../src/runtime/spec/log-path.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import {
  dnsConfigProblems,
  isIpAddress,
  MAX_PORT_MAPPINGS,
  portMappingProblems,
  sysctlProblems,
} from '../../../src/runtime/spec/sandbox-fields.js';
import { thrown } from '../../helpers/kata-error.js';

const port = (p: Partial<PortMapping__Output> = {}): PortMapping__Output => ({
  protocol: 'TCP',
  container_port: 80,
  host_port: 8080,
  host_ip: '',
  ...p,
});

describe('port mappings', () => {
  it('what the kubelet and critest send passes', () => {
    const ok = [
      port(),
      port({ protocol: 'UDP', host_port: 0 }),
      port({ protocol: 'SCTP', host_ip: '127.0.0.1' }),
      port({ host_ip: '::1' }),
    ];
    expect(portMappingProblems(ok, 'config.port_mappings')).toEqual([]);
  });

  it.each([
    ['a protocol grpc-js did not know (a number)', port({ protocol: 7 as unknown as 'TCP' }), 'config.port_mappings[0].protocol is 7'],
    ['a protocol by another name', port({ protocol: 'tcp' as 'TCP' }), 'config.port_mappings[0].protocol is "tcp"'],
    ['container port 0', port({ container_port: 0 }), 'config.port_mappings[0].container_port is 0'],
    ['a negative host port', port({ host_port: -1 }), 'config.port_mappings[0].host_port is -1'],
    ['a host port past 65535', port({ host_port: 65_536 }), 'config.port_mappings[0].host_port is 65536'],
    ['a host_ip that is not an address', port({ host_ip: '1.2.3.4; rm -rf /' }), 'config.port_mappings[0].host_ip'],
    ['a host_ip with a zone', port({ host_ip: 'fe80::1%eth0' }), 'config.port_mappings[0].host_ip'],
  ])('%s', (_what, p, words) => {
    const problems = portMappingProblems([p], 'config.port_mappings');
    expect(problems.map((x) => x.reason)).toEqual(['SANDBOX_PORT_MAPPING_INVALID']);
    expect(problems[0]?.message).toContain(words);
  });

  it('a flood of mappings', () => {
    const many = Array.from({ length: MAX_PORT_MAPPINGS + 1 }, () => port());
    expect(portMappingProblems(many, 'p')[0]?.message).toContain(`at most ${MAX_PORT_MAPPINGS}`);
  });
});

describe('isIpAddress', () => {
  it('takes what Go net.ParseIP takes', () => {
    for (const ok of [
      '0.0.0.0',
      '10.88.0.1',
      '255.255.255.255',
      '::',
      '::1',
      'fd00::1',
      '2001:db8:0:0:0:0:0:1',
      '::ffff:10.0.0.1',
      'a:b:c:d:e:f:1:2',
    ])
      expect(isIpAddress(ok), ok).toBe(true);
    for (const bad of ['', '1.2.3', '1.2.3.4.5', '256.1.1.1', '01.2.3.4', '1:2:3:4:5:6:7:8:9', '1::2::3', 'g::1', '1.2.3.4::', 'x', '::1 '])
      expect(isIpAddress(bad), bad).toBe(false);
  });
});

describe('dns_config and sysctls', () => {
  it('what the kubelet and critest send passes', () => {
    expect(
      dnsConfigProblems(
        { servers: ['10.96.0.10', 'fd00::a'], searches: ['ns.svc.cluster.local', 'cluster.local'], options: ['ndots:5'] },
        'd',
      ),
    ).toEqual([]);
    expect(
      sysctlProblems({ 'kernel.shm_rmid_forced': '1', 'fs.mqueue.msg_max': '100', 'net.ipv4.ip_local_port_range': '1024\t65000' }, 's'),
    ).toEqual([]);
  });

  it('a newline in a search domain or an option would add a resolv.conf line', () => {
    const p = dnsConfigProblems({ servers: [], searches: ['a\nnameserver 6.6.6.6'], options: ['ndots:5 x'] }, 'config.dns_config');
    expect(p.map((x) => x.message.split(' ')[0])).toEqual(['config.dns_config.searches[0]', 'config.dns_config.options[0]']);
    expect(dnsConfigProblems({ servers: ['evil.example'], searches: [], options: [] }, 'd')[0]?.message).toContain('d.servers[0]');
  });

  it('a sysctl that is a path, or a value of more than one line', () => {
    expect(sysctlProblems({ '../../proc/sysrq-trigger': 'c' }, 'config.linux.sysctls')[0]?.message).toContain('config.linux.sysctls key');
    expect(sysctlProblems({ 'kernel.x': 'a\nb' }, 'config.linux.sysctls')[0]?.message).toContain('value of "kernel.x"');
  });
});

describe('log_directory and log_path', () => {
  it('the kubelet and critest directories pass; anything not normalised is refused', () => {
    for (const ok of ['', '/var/log/pods/ns_name_uid', '/tmp/podLogTest123/PodSandbox-with-log-directory-x'])
      expect(() => checkLogDirectory(ok, 'config.log_directory')).not.toThrow();
    for (const bad of ['var/log', '/', '/var//log', '/var/log/', '/var/./log', '/var/log/../../etc', '/a\0b'])
      expect(thrown(() => checkLogDirectory(bad, 'config.log_directory')).reason, bad).toBe('SANDBOX_LOG_DIRECTORY_INVALID');
  });

  it('log_path is relative, without "..", naming a file', () => {
    for (const ok of ['', 'app/0.log', '0.log']) expect(() => checkLogPath(ok, 'config.log_path')).not.toThrow();
    for (const bad of ['/etc/passwd', '../x.log', 'a/../../x', 'app/', '.', 'a\0b'])
      expect(thrown(() => checkLogPath(bad, 'config.log_path')).reason, bad).toBe('CONTAINER_LOG_PATH_INVALID');
  });
});

describe('decodeSandboxSpec refuses them before anything is planned', () => {
  const request = (config: Record<string, unknown>) =>
    decodeProtoJson<RunPodSandboxRequest__Output>('runtime.v1.RunPodSandboxRequest', {
      config: { metadata: { name: 'web', uid: 'u-1', namespace: 'shop' }, ...config },
    }).config;

  it.each([
    [{ portMappings: [{ containerPort: 80, hostPort: 70000 }] }, 'SANDBOX_PORT_MAPPING_INVALID', 'config.port_mappings[0].host_port'],
    [{ dnsConfig: { servers: ['1.1.1.1\nx'] } }, 'SANDBOX_DNS_CONFIG_INVALID', 'config.dns_config.servers[0]'],
    [{ linux: { sysctls: { 'a b': '1' } } }, 'SANDBOX_SYSCTL_INVALID', 'config.linux.sysctls key'],
    [{ logDirectory: '/var/log/pods/../../../etc' }, 'SANDBOX_LOG_DIRECTORY_INVALID', 'config.log_directory'],
  ])('%j', (config, reason, words) => {
    const err = thrown(() => decodeSandboxSpec(request(config)));
    expect([err.kind, err.reason]).toEqual(['invalid', reason]);
    expect(err.message).toContain(words);
  });
});

describe('decodeContainerSpec: mount propagation and paths', () => {
  const config = (mounts: Array<Record<string, unknown>>) =>
    ({
      ...decodeProtoJson<CreateContainerRequest__Output>('runtime.v1.CreateContainerRequest', {
        config: { metadata: { name: 'app' }, image: { image: 'busybox' } },
      }).config!,
      mounts: mounts.map((m) => ({
        container_path: '/data',
        host_path: '/var/lib/x',
        readonly: false,
        selinux_relabel: false,
        propagation: 'PROPAGATION_PRIVATE',
        uidMappings: [],
        gidMappings: [],
        recursive_read_only: false,
        image: null,
        image_sub_path: '',
        ...m,
      })),
    }) as unknown as CreateContainerRequest__Output['config'];

  it('the three CRI propagations pass', () => {
    for (const propagation of ['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER', 'PROPAGATION_BIDIRECTIONAL'])
      expect(decodeContainerSpec(config([{ propagation }])).mounts).toHaveLength(1);
  });

  it('a propagation grpc-js did not know (a number), or a NUL in a path, is refused naming the mount', () => {
    const unknown = thrown(() => decodeContainerSpec(config([{}, { propagation: 7 }])));
    expect([unknown.kind, unknown.reason]).toEqual(['invalid', 'CONTAINER_MOUNT_SOURCE_INVALID']);
    expect(unknown.message).toContain('config.mounts[1].propagation is 7');
    expect(thrown(() => decodeContainerSpec(config([{ host_path: '/a\0b' }]))).message).toContain('config.mounts[0]');
  });
});
