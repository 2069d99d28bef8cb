/**
 * A config.json as nerdctl 2 writes it for `nerdctl run --net none --cpus 1 --memory 768m ...`
 * (read from nerdctl's pkg/cmd/container: create.go, run_cgroup_linux.go, run_mount.go), decoded
 * as a single-container task. It differs from ctr's (solo.test.ts) in what nerdctl adds:
 * a 64-hex container id and its first 12 digits as the hostname; `nerdctl/*` container labels
 * copied into the spec's annotations (JSON values among them); OCI hooks running
 * `nerdctl internal oci-hook createRuntime|postStop`; /etc/hosts, /etc/hostname and
 * /etc/resolv.conf bound from its data root (each path naming the container id); a zero
 * real-time CPU pair always, and a swap limit of twice the memory limit.
 *
 * The integration test with the real nerdctl is test/integration/shim/nerdctl.test.ts (skipped
 * where no nerdctl runs: Debian carries no package of it).
 */
import { describe, expect, it } from 'vitest';
import { decodeSoloTask } from '../../../../src/shim/decode/index.js';
import { resolveDemand } from '../../../../src/sizing/sources.js';
import { type EditableJson, edited } from './fixtures.js';

const CTR_RUN = 'containerd/1.6.20/ctr-run.solo.json';
const ID = 'c3f1e0a2b4d6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081';
const NS = 'nerdctl-test';
const DATA = '/var/lib/nerdctl/1935db59';

function nerdctlSpec(edit: (o: EditableJson) => void = () => undefined): EditableJson {
  return edited(CTR_RUN, (o) => {
    o.hostname = ID.slice(0, 12);
    o.process.env = [...o.process.env, `HOSTNAME=${ID.slice(0, 12)}`];
    o.linux.cgroupsPath = `/${NS}/${ID}`;
    o.linux.resources.cpu = { quota: 100000, period: 100000, realtimeRuntime: 0, realtimePeriod: 0 };
    o.linux.resources.memory = { limit: 768 * 1024 * 1024, swap: 2 * 768 * 1024 * 1024 };
    o.mounts.push(
      { destination: '/sys/fs/cgroup', type: 'cgroup', source: 'cgroup', options: ['ro', 'nosuid', 'noexec', 'nodev'] },
      {
        destination: '/etc/resolv.conf',
        type: 'bind',
        source: `${DATA}/containers/${NS}/${ID}/resolv.conf`,
        options: ['bind', 'rprivate'],
      },
      { destination: '/etc/hosts', type: 'bind', source: `${DATA}/etchosts/${NS}/${ID}/hosts`, options: ['bind', 'rprivate'] },
      { destination: '/etc/hostname', type: 'bind', source: `${DATA}/containers/${NS}/${ID}/hostname`, options: ['bind', 'rprivate'] },
    );
    const hook = (event: string) => ({
      path: '/usr/local/bin/nerdctl',
      args: ['/usr/local/bin/nerdctl', '--data-root', '/var/lib/nerdctl', 'internal', 'oci-hook', event],
      env: ['PATH=/usr/bin:/bin:/usr/sbin:/sbin'],
    });
    o.hooks = { createRuntime: [hook('createRuntime')], poststop: [hook('postStop')] };
    o.annotations = {
      'nerdctl/namespace': NS,
      'nerdctl/name': 'kts-fg',
      'nerdctl/hostname': ID.slice(0, 12),
      'nerdctl/extraHosts': '[]',
      'nerdctl/networks': '["none"]',
      'nerdctl/state-dir': `${DATA}/containers/${NS}/${ID}`,
      'nerdctl/log-uri': `binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=${DATA}`,
      'nerdctl/platform': 'linux/amd64',
      'nerdctl/dns': '{"DNSServers":null,"DNSResolvConfOptions":null,"DNSSearchDomains":null}',
      'nerdctl/host-config': '{"BlkioWeight":0,"CidFile":"","Devices":null}',
      'nerdctl/log-config': '{"driver":"json-file","opts":{}}',
      'nerdctl/mounts': '[]',
      'nerdctl/auto-remove': 'true',
    };
    edit(o);
  });
}

const decode = (oci: unknown) => decodeSoloTask(oci, { namespace: NS, id: ID, stdin: false });

describe("decodeSoloTask: nerdctl's config.json", () => {
  it('is a pod of its own named from the 64-hex id, with the 12-digit hostname and the cgroup parent /<namespace>', () => {
    const { pod, cgroup, netnsPath } = decode(nerdctlSpec());
    expect(pod.metadata).toEqual({ name: ID, uid: ID, namespace: 'nerdctl-test', attempt: 0 });
    expect(pod.hostname).toBe(ID.slice(0, 12));
    expect(cgroup).toEqual({ driver: 'cgroupfs', parent: `/${NS}`, cgroupsPath: `/${NS}/${ID}` });
    // --net none: a network namespace without a path, so the VM gets no NIC.
    expect(netnsPath).toBeNull();
  });

  it('sizes the VM from --cpus and --memory (the zero real-time pair and the swap limit change nothing)', () => {
    const { pod } = decode(nerdctlSpec());
    const demand = resolveDemand(pod);
    expect(demand.source).toBe('linux_resources');
    expect([demand.cpuLimitMillis, demand.memoryLimitBytes]).toEqual([1000n, BigInt(768 * 1024 * 1024)]);
    // Without --cpus and --memory nerdctl still writes the real-time pair: no limits, the handler's default VM.
    const none = decode(
      nerdctlSpec((o) => {
        o.linux.resources.cpu = { realtimeRuntime: 0, realtimePeriod: 0 };
        delete o.linux.resources.memory;
      }),
    ).pod;
    expect(none.linux?.resources ?? null).toBeNull();
  });

  it("keeps nerdctl's annotations on the pod, drops its hosts/hostname/resolv.conf binds (the guest makes its own), ignores its hooks", () => {
    const { pod, container } = decode(nerdctlSpec());
    expect(pod.annotations['nerdctl/networks']).toBe('["none"]');
    expect(pod.annotations['nerdctl/name']).toBe('kts-fg');
    expect(container.mounts.map((m) => m.container_path)).toEqual([]);
    expect(container.command.concat(container.args).length).toBeGreaterThan(0);
  });

  it('a bind nerdctl -v adds is kept, as any bind mount', () => {
    const { container } = decode(
      nerdctlSpec((o) => o.mounts.push({ destination: '/data', type: 'bind', source: '/srv/data', options: ['rbind', 'ro'] })),
    );
    expect(container.mounts.map((m) => [m.container_path, m.host_path, m.readonly])).toEqual([['/data', '/srv/data', true]]);
  });
});
