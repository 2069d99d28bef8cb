/**
 * A container without CRI annotations (`ctr run`, `nerdctl run`) decoded into the pod made for it
 * and the container: the fixture is `ctr oci spec` of containerd 1.6.20 with what `ctr run
 * --memory-limit 268435456 --cpus 1.5 ... sh -c '...'` adds (args, env, cgroupsPath, limits).
 */
import { describe, expect, it } from 'vitest';
import { decodeSoloTask, isSoloBundle, podNameFor, podNamespaceFor } from '../../../../src/shim/decode/index.js';
import { resolveDemand } from '../../../../src/sizing/sources.js';
import { thrown } from '../../../helpers/kata-error.js';
import { type EditableJson, edited, loadConfig } from './fixtures.js';

const CTR_RUN = 'containerd/1.6.20/ctr-run.solo.json';
const CRI_CONTAINER = 'containerd/1.6.20/container.config.synthetic.json';
const CRI_SANDBOX = 'containerd/1.6.20/sandbox.config.synthetic.json';
const CRIO_SANDBOX = 'cri-o/1.28/sandbox.config.synthetic.json';

const decode = (oci: unknown, id = 'solo-1', namespace = 'default') => decodeSoloTask(oci, { namespace, id, stdin: false });

describe('isSoloBundle: a config.json that names no pod', () => {
  it("is one without containerd's or CRI-O's container type and sandbox id; every CRI spec names a pod", () => {
    expect(isSoloBundle(loadConfig(CTR_RUN))).toBe(true);
    expect(isSoloBundle({ ociVersion: '1.0.2' })).toBe(true);
    for (const name of [CRI_CONTAINER, CRI_SANDBOX, CRIO_SANDBOX]) expect(isSoloBundle(loadConfig(name)), name).toBe(false);
    // A sandbox id alone is enough to belong to a pod.
    expect(isSoloBundle({ ociVersion: '1.0.2', annotations: { 'io.kubernetes.cri.sandbox-id': 'abc' } })).toBe(false);
  });
});

describe('decodeSoloTask: the pod synthesized for a single container', () => {
  it('names the pod from the container id and the containerd namespace', () => {
    const { pod } = decode(loadConfig(CTR_RUN), 'web_1.a', 'k8s.io');
    expect(pod.metadata).toEqual({ name: 'web-1.a', uid: 'web_1.a', namespace: 'k8s-io', attempt: 0 });
    expect(podNamespaceFor('Team_A.prod')).toBe('team-a-prod');
    expect(podNameFor('a_b_c')).toBe('a-b-c');
  });

  it("sizes the VM from the container's own CPU quota/period and memory limit, through the sizing planner", () => {
    const { pod } = decode(loadConfig(CTR_RUN));
    expect(pod.linux?.resources).toMatchObject({
      cpu_quota: '150000',
      cpu_period: '100000',
      cpu_shares: '0',
      memory_limit_in_bytes: '268435456',
    });
    const demand = resolveDemand(pod);
    expect(demand.source).toBe('linux_resources');
    expect([demand.cpuLimitMillis, demand.memoryLimitBytes]).toEqual([1500n, 268435456n]);
    const shares = decode(
      edited(CTR_RUN, (o) => {
        o.linux.resources.cpu = { shares: 2048 };
        o.linux.resources.memory = { limit: -1 };
      }),
    ).pod;
    expect(resolveDemand(shares)).toMatchObject({ cpuRequestMillis: 2000n, memoryLimitBytes: 0n });
    // No limits at all: the handler's defaults size the VM, as for a pod that sends none.
    const none = decode(edited(CTR_RUN, (o) => delete o.linux.resources.cpu && delete o.linux.resources.memory)).pod;
    expect(none.linux?.resources ?? null).toBeNull();
  });

  it('takes the hostname, the cgroup parent (ctr: /<namespace>/<id>), privilege, and a network namespace path when there is one', () => {
    const plain = decode(loadConfig(CTR_RUN));
    expect(plain.pod.hostname).toBe('');
    expect(plain.pod.linux?.cgroup_parent).toBe('/default');
    expect(plain.cgroup).toEqual({ driver: 'cgroupfs', parent: '/default', cgroupsPath: '/default/solo-1' });
    expect(plain.netnsPath).toBeNull();
    expect(plain.pod.linux?.security_context?.privileged).toBe(false);
    const withNet = decode(
      edited(CTR_RUN, (o: EditableJson) => {
        o.hostname = 'box';
        o.linux.namespaces = o.linux.namespaces.map((n: { type: string }) =>
          n.type === 'network' ? { type: 'network', path: '/var/run/netns/cni-1' } : n,
        );
        o.linux.resources.devices = [{ allow: true, access: 'rwm' }];
      }),
    );
    expect(withNet.pod.hostname).toBe('box');
    expect(withNet.netnsPath).toBe('/var/run/netns/cni-1');
    expect(withNet.pod.linux?.security_context?.privileged).toBe(true);
    expect(withNet.container.linux?.security_context?.privileged).toBe(true);
  });

  it("runs the container's process as given, in the pod's network and IPC, its kernel filesystems left to the guest", () => {
    const { container } = decode(loadConfig(CTR_RUN));
    expect(container.command).toEqual(['sh', '-c', 'echo hello; exit 3']);
    expect(container.args).toEqual([]);
    expect(container.metadata).toEqual({ name: 'solo-1', attempt: 0 });
    expect(container.image.image).toBe('default/solo-1');
    expect(container.mounts).toEqual([]);
    expect(container.linux?.security_context?.namespace_options).toMatchObject({ network: 'POD', ipc: 'POD', pid: 'CONTAINER' });
    expect(container.linux?.resources).toMatchObject({ cpu_quota: '150000', memory_limit_in_bytes: '268435456' });
  });

  it('refuses bad input with a SHIM_* or sizing code naming the field', () => {
    const cases: Array<[EditableJson, string, RegExp]> = [
      [edited(CTR_RUN, (o) => (o.linux.resources.cpu.quota = -5)), 'SIZING_INTEGER_INVALID', /linux\.resources\.cpu\.quota/],
      [edited(CTR_RUN, (o) => (o.linux.resources.memory.limit = 'lots')), 'SHIM_SPEC_INVALID', /linux\.resources\.memory\.limit/],
      [edited(CTR_RUN, (o) => (o.process.args = [])), 'SHIM_SPEC_INVALID', /process\.args/],
      [edited(CTR_RUN, (o) => (o.linux.cgroupsPath = 'a:b')), 'SHIM_CGROUPS_PATH_INVALID', /linux\.cgroupsPath/],
      [
        edited(CTR_RUN, (o) => {
          o.linux.namespaces = [{ type: 'network', path: 'relative/ns' }];
        }),
        'SHIM_SOLO_INVALID',
        /linux\.namespaces\[type=network\]\.path/,
      ],
      [edited(CTR_RUN, (o) => (o.hostname = 'not a host')), 'SANDBOX_HOSTNAME_INVALID', /hostname/],
      [edited(CTR_RUN, (o) => (o.process.env = ['NOEQUALS'])), 'SHIM_ENV_INVALID', /process\.env\[0\]/],
    ];
    for (const [oci, reason, field] of cases) {
      const err = thrown(() => decode(oci));
      expect(err.reason, err.message).toBe(reason);
      expect(err.message).toMatch(field);
    }
    const ns = thrown(() => decode(loadConfig(CTR_RUN), 'solo-1', 'bad ns'));
    expect([ns.reason, ns.details]).toEqual(['SHIM_SOLO_INVALID', { field: 'namespace' }]);
    const pod = thrown(() => decode(loadConfig(CRI_CONTAINER)));
    expect(pod.reason).toBe('SHIM_SOLO_INVALID');
  });
});
