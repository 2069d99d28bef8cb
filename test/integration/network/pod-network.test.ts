/**
 * Pod networking with real CNI plugins (Debian's bridge, host-local, portmap) and real QEMU (TCG):
 * the daemon runs inside a "node" network namespace this test creates (test/helpers/network-node.ts),
 * pods get addresses (dual-stack: a private IPv4 /24 and an IPv6 ULA /64) that exist only there,
 * and every request to a pod is made from inside that namespace. Two pod VMs serve all the
 * assertions; a third is killed with the daemon in the middle of RunPodSandbox.
 */

import { execFileSync } from 'node:child_process';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { netnsNameFor } from '../../../src/network/index.js';
import { agentGuestDir } from '../../helpers/agent-guest.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { processesMentioning } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createNetworkNode, type NetworkNode } from '../../helpers/network-node.js';
import { until as pollUntil } from '../../helpers/poll.js';
import { createTestRuntime, ownNetnsNames, podConfig, pullThenMoveIntoNode, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
// busybox's wget segfaults here (static Debian build), so in-guest clients use nc.
const APPLETS = ['sleep', 'httpd', 'nc', 'cat', 'mkdir', 'echo', 'printf'];
const HTTP_PORT = 8080;
const HOST_PORT = 18080;

/** The guest this branch's agent needs (ConfigureNetwork): KATA_TS_GUEST_DIR, else the tests' agent guest. */
function networkGuestDir(): string {
  const given = process.env.KATA_TS_GUEST_DIR;
  if (given !== undefined) return given;
  const dir = agentGuestDir();
  execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
  return dir;
}

/** QEMU processes whose command line names `dir` (virtiofsd, which also does, left out). */
function qemusUnder(dir: string): number[] {
  return processesMentioning(dir).filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('qemu-system');
    } catch {
      return false;
    }
  });
}

const until = <T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> =>
  pollUntil(what, () => fn().catch(() => undefined), timeoutMs, 250);

describe('pod networking through CNI (real plugins, real QEMU, a node namespace of our own)', () => {
  let node: NetworkNode;
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  const sandboxes: string[] = [];
  let podA: string;
  let podAIp: string;
  let podAIp6: string;
  let podAConfig: Record<string, unknown>;

  const runPod = async (name: string, extra: Record<string, unknown> = {}): Promise<{ id: string; config: Record<string, unknown> }> => {
    const config = { ...podConfig(rt, name), hostname: name, ...extra };
    const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox({ config }, { deadline: Date.now() + 180_000 });
    sandboxes.push(id);
    return { id, config };
  };
  const runContainer = async (
    sandboxId: string,
    sandboxConfig: Record<string, unknown>,
    name: string,
    command: string[],
  ): Promise<string> => {
    const { container_id: id } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: sandboxId,
      config: { metadata: { name, attempt: 0 }, image: { image }, command, log_path: `${name}.log` },
      sandbox_config: sandboxConfig,
    });
    await rt.cri.runtime.StartContainer({ container_id: id });
    return id;
  };
  const exec = async (containerId: string, cmd: string[]): Promise<{ stdout: string; exit: number }> => {
    const r = await rt.cri.runtime.ExecSync({ container_id: containerId, cmd, timeout: 20 });
    return { stdout: Buffer.from(r.stdout).toString('utf8'), exit: r.exit_code };
  };
  const statusOf = (id: string) => rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id });
  const fromNode = (url: string) => node.httpGet(url);
  /** An HTTP GET from inside a container, with busybox nc; the body (after the headers). */
  const getFromContainer = async (containerId: string, host: string, port: number): Promise<string> => {
    const r = await exec(containerId, ['sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 ${host} ${port}`]);
    return r.exit === 0 ? r.stdout.slice(r.stdout.indexOf('\r\n\r\n') + 4) : `exit ${r.exit}: ${r.stdout}`;
  };

  beforeAll(async () => {
    const guestDir = networkGuestDir();
    node = await createNetworkNode();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', '1.0', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      network: node.networkConfig(),
      hypervisor: {
        kernelPath: path.join(guestDir, 'vmlinuz'),
        initrdPath: path.join(guestDir, 'initramfs.cpio.gz'),
        guestImagePath: path.join(guestDir, 'guest.img'),
      },
    });
    await allowLoopbackRegistries(rt);
    await pullThenMoveIntoNode(rt, image, node.netnsPath);
  }, scaledMs(300_000));

  afterAll(async () => {
    if (rt !== undefined) {
      for (const id of sandboxes) {
        await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
      }
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
      await rt.cleanup();
    }
    await node?.cleanup(sandboxes.map(netnsNameFor));
    await registry?.stop();
  }, scaledMs(120_000));

  it('Status: NetworkReady from the node CNI config', async () => {
    const { status } = await rt.cri.runtime.Status({});
    const net = status!.conditions.find((c) => c.type === 'NetworkReady');
    expect(net).toMatchObject({ status: true });
    expect(net?.message).toContain(node.cniConfDir);
  });

  it(
    'a pod gets an IP from host-local, reported by PodSandboxStatus',
    async () => {
      const a = await runPod('net-a', {
        port_mappings: [{ protocol: 'TCP', container_port: HTTP_PORT, host_port: HOST_PORT, host_ip: '' }],
        dns_config: { servers: ['10.96.0.10'], searches: ['kata-ts.test'], options: ['ndots:2'] },
      });
      podA = a.id;
      podAConfig = a.config;
      const { status } = await statusOf(podA);
      expect(status!.state).toBe('SANDBOX_READY');
      podAIp = status!.network!.ip;
      expect(podAIp.startsWith(`${node.prefix}.`)).toBe(true);
      expect(await node.allocations()).toContain(podAIp);
      // Dual-stack: the IPv6 address of the pod (host-local's second range) is the additional IP.
      podAIp6 = status!.network!.additional_ips.map((a) => a.ip).find((ip) => ip.includes(':')) ?? '';
      expect(podAIp6.startsWith(node.subnet6.replace('::/64', '::'))).toBe(true);
      expect(await node.allocations()).toContain(podAIp6);
      const verbose = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podA, verbose: true });
      const info = JSON.parse(verbose.info.info!) as { network: Record<string, unknown>; plan: { qemu: { argv: string[] } } };
      expect(info.network).toMatchObject({
        netns: `/run/netns/${netnsNameFor(podA)}`,
        tap: 'tap0_kata',
        cniAttached: true,
        tapWired: true,
      });
      // The NIC in the executed plan carries the CNI interface's MAC.
      expect(info.plan.qemu.argv.some((a) => a.startsWith('virtio-net-pci,') && a.includes(`mac=${String(info.network.mac)}`))).toBe(true);
    },
    scaledMs(240_000),
  );

  it(
    'a server in a container answers from the node namespace; containers of the pod talk over localhost',
    async () => {
      await runContainer(podA, podAConfig, 'web', [
        'sh',
        '-c',
        `mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p ${HTTP_PORT} -h /www`,
      ]);
      const peer = await runContainer(podA, podAConfig, 'peer', ['sleep', '3600']);
      const body = await until('the pod to answer from the node namespace', async () => {
        const out = await fromNode(`http://${podAIp}:${HTTP_PORT}/`);
        return out.includes('hello-from-pod') ? out : undefined;
      });
      expect(body.trim()).toBe('hello-from-pod');
      const body6 = await until('the pod to answer over IPv6', async () => {
        const out = await fromNode(`http://[${podAIp6}]:${HTTP_PORT}/`);
        return out.includes('hello-from-pod') ? out : undefined;
      });
      expect(body6.trim()).toBe('hello-from-pod');
      expect(await getFromContainer(peer, '127.0.0.1', HTTP_PORT)).toBe('hello-from-pod\n');
    },
    scaledMs(240_000),
  );

  it(
    'hostPort: the portmap mapping answers from the node namespace',
    async () => {
      const body = await until('the hostPort mapping', async () => {
        const out = await fromNode(`http://${node.gateway}:${HOST_PORT}/`);
        return out.includes('hello-from-pod') ? out : undefined;
      });
      expect(body.trim()).toBe('hello-from-pod');
    },
    scaledMs(120_000),
  );

  it('DNS options of the CRI DNSConfig land in the resolv.conf the pod sees', async () => {
    const peer = (
      await rt.cri.runtime.ListContainers({
        filter: { pod_sandbox_id: podA },
      })
    ).containers.find((c) => c.metadata!.name === 'peer')!;
    const { stdout } = await exec(peer.id, ['cat', '/etc/resolv.conf']);
    expect(stdout).toBe('nameserver 10.96.0.10\nsearch kata-ts.test\noptions ndots:2\n');
  });

  it(
    'two pods talk to each other over the bridge; Stop runs CNI DEL, Remove the namespace: nothing is left',
    async () => {
      const b = await runPod('net-b');
      const { status } = await statusOf(b.id);
      const podBIp = status!.network!.ip;
      expect(podBIp.startsWith(`${node.prefix}.`)).toBe(true);
      expect(podBIp).not.toBe(podAIp);
      const client = await runContainer(b.id, b.config, 'client', ['sleep', '3600']);
      expect(await getFromContainer(client, podAIp, HTTP_PORT)).toBe('hello-from-pod\n');

      const linksBefore = await node.links();
      const netns = netnsNameFor(b.id);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: b.id });
      expect(await node.allocations()).not.toContain(podBIp);
      expect((await node.links()).length).toBe(linksBefore.length - 1); // B's veth
      // The namespace stays until RemovePodSandbox; the TAP and its filters went with Stop. Its
      // file is bound in the runtime's mount namespace (on the host it is an empty file).
      const inPod = await rt.inNamespace(['ip', '-n', netns, '-j', 'link', 'show']);
      expect((JSON.parse(inPod) as Array<{ ifname: string }>).map((l) => l.ifname)).toEqual(['lo']);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: b.id }); // idempotent
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: b.id });
      await expect(fsp.access(`/run/netns/${netns}`)).rejects.toThrow();
      // Pod A is untouched.
      expect((await fromNode(`http://${podAIp}:${HTTP_PORT}/`)).trim()).toBe('hello-from-pod');
    },
    scaledMs(300_000),
  );

  it(
    'kill -9 of the daemon in the middle of RunPodSandbox: the next start leaves no veth, TAP, namespace or allocation',
    async () => {
      const allocationsBefore = await node.allocations();
      const linksBefore = await node.links();
      // /run/netns is the machine's: only names that appear during this test are the pod's.
      const netnsBefore = new Set(await fsp.readdir('/run/netns').catch(() => []));
      const config = { ...podConfig(rt, 'net-c'), hostname: 'net-c' };
      const pending = rt.cri.runtime.RunPodSandbox({ config }, { deadline: Date.now() + 180_000 }).catch((e: unknown) => e);
      // Killed once CNI ADD has allocated the pod's address and QEMU runs in the pod's namespace.
      const vmsBefore = qemusUnder(path.join(rt.stateDir, 'vm')).length;
      await until('CNI ADD of the third pod', async () =>
        (await node.allocations()).length > allocationsBefore.length ? true : undefined,
      );
      await until('the third pod VM', async () => (qemusUnder(path.join(rt.stateDir, 'vm')).length > vmsBefore ? true : undefined));
      process.kill(rt.pid(), 'SIGKILL');
      await pending;
      // Of those, only this daemon's (its state dir and log name the killed pod's id): another
      // run on the machine may make pods of its own meanwhile.
      const own = new Set(await ownNetnsNames(rt));
      const made = (await fsp.readdir('/run/netns')).filter(
        (n) => n.startsWith('kata-ts-') && own.has(n) && !netnsBefore.has(n) && !sandboxes.map(netnsNameFor).includes(n),
      );
      await rt.start();
      expect(await node.allocations()).toEqual(allocationsBefore);
      expect((await node.links()).sort()).toEqual([...linksBefore].sort());
      expect(made).toHaveLength(1);
      for (const n of made) await expect(fsp.access(`/run/netns/${n}`)).rejects.toThrow();
      expect(qemusUnder(path.join(rt.stateDir, 'vm')).length).toBe(vmsBefore);
      const { items } = await rt.cri.runtime.ListPodSandbox({});
      expect(items.map((i) => i.id)).toEqual([podA]);
      // The running pod survived the daemon's death.
      expect((await fromNode(`http://${podAIp}:${HTTP_PORT}/`)).trim()).toBe('hello-from-pod');
    },
    scaledMs(300_000),
  );

  it(
    'after kill -9 with a running pod, Stop + Remove still release everything',
    async () => {
      process.kill(rt.pid(), 'SIGKILL');
      await new Promise((r) => setTimeout(r, 200));
      await rt.start();
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: podA });
      expect(await node.allocations()).toEqual([]);
      const nodeLinks = await node.links();
      expect(nodeLinks.filter((l) => l.startsWith('veth'))).toEqual([]);
      const rules = await node.exec(['iptables-save', '-t', 'nat']);
      expect(rules).not.toContain(`${HOST_PORT}`);
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podA });
      await expect(fsp.access(`/run/netns/${netnsNameFor(podA)}`)).rejects.toThrow();
    },
    scaledMs(180_000),
  );
});
