/**
 * CRI-O's side of a `runtime_type = "vm"` handler, replayed by a test (no CRI-O is installed
 * here): what CRI-O 1.28+ hands the shim (internal/oci/runtime_vm.go, through containerd's
 * runtime/v2/shim Command) and what it does with the answers.
 *
 * - The command line and environment of `start` (every container, the pause one included) and
 *   of `delete`: `-namespace default -address "" -publish-binary <crio> -id <id> <action>`, cwd
 *   the bundle, stdin /dev/null, CRI-O's environment plus GOMAXPROCS=2, MAX_SHIM_VERSION=2,
 *   TTRPC_ADDRESS="" (CRI-O has no events service), GRPC_ADDRESS="", NAMESPACE=default; the
 *   shim's log FIFO `<bundle>/log` made and read before `start`, stdout and stderr read together.
 * - Bundles as CRI-O lays them out (`<run>/overlay-containers/<id>/userdata`, config.json
 *   written from fixtures/cri-o/1.28 with this test's ids and paths): the pod's network namespace
 *   is one the test made (test/helpers/join-netns.ts: eth0 with an address), its cgroupsPath
 *   `<parent>/crio-<id>` under a private cgroup root (`kata-ts-test-*`, removed afterwards), a
 *   container's root filesystem a mounted image CRI-O names by `root.path`
 *   (`<storage>/overlay/<id>/merged`, here a busybox tree), never `<bundle>/rootfs`.
 * - The task API as CRI-O's ttrpc client calls it (containerd.task.v2.Task, the namespace in the
 *   metadata), and FIFOs made with mkfifo and opened by the test before Create/Exec.
 *
 * cleanup() kills every process that names the test's directory (the shim's serve, QEMU,
 * virtiofsd) by pid, unmounts what is mounted under it, removes the private cgroup tree, the
 * namespaces and the directory, also after a failure.
 */
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { openFifoSocket } from '../../src/common/fifo.js';
import { silentLogger } from '../../src/common/logger.js';
import { packageRoot } from '../../src/common/paths.js';
import { runtimeDefaultProfile } from '../../src/oci/index.js';
import { mountsUnder, releaseSharedMounts } from '../../src/runtime/sandbox/shared-dir.js';
import { podStateDir, shimSocketPath } from '../../src/shim/paths.js';
import {
  decodeMessage,
  encodeMessage,
  type Message,
  type MessageInput,
  type MessageName,
  NAMESPACE_METADATA_KEY,
  TASK_SERVICE_V2,
} from '../../src/shim/proto.js';
import { connectTtrpc, type TtrpcClient } from '../../src/ttrpc/index.js';
import { processesMentioning } from './hypervisor-guest.js';
import { busyboxBaseEntries } from './images-builder.js';
import { createJoinNamespaces, type JoinNamespaces } from './join-netns.js';
import { removeCgroupTree } from './runtime-daemon.js';
import { installTestShim, shimTestConfig } from './shim-config.js';

const execFileAsync = promisify(execFile);

/** containerd's `namespaces.Default`, the namespace CRI-O's VM runtime puts in its context. */
export const CRIO_NAMESPACE = 'default';
/** What `-publish-binary` names: CRI-O's own executable (os.Executable()). */
export const CRIO_BINARY = '/usr/bin/crio';
const FIXTURES = path.join(packageRoot(), 'fixtures', 'cri-o', '1.28');
/** The ids and paths the fixtures were written with, replaced by this test's. */
const FIXTURE = {
  sandboxId: '7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f',
  containerId: '0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0',
  podUid: '8d2b6a8e-5c0f-4b8e-9a3e-2f1c7d9e4b61',
  netnsId: '4d0a3c2e-1b7f-4e9a-8c6d-5f3e2a1b0c9d',
};
const APPLETS = ['sleep', 'tail', 'hostname', 'ip', 'printf', 'stty'];

/** A 64-hex id, as CRI-O's utils.GenerateID makes for containers and exec processes. */
export function crioId(): string {
  return randomBytes(32).toString('hex');
}

/** Output read from a FIFO the test made, as CRI-O's container IO reads it. */
export interface FifoReader {
  path: string;
  text(): string;
  /** Resolves when the writer's end has closed (EOF). */
  ended: Promise<void>;
  close(): void;
}

export interface ContainerBundle {
  id: string;
  bundle: string;
  /** The mounted image CRI-O names by root.path. */
  rootfs: string;
  /** config.json as written. */
  spec: Record<string, unknown>;
}

export interface ContainerOptions {
  name: string;
  args: string[];
  /** linux.resources.memory.limit (bytes). */
  memoryLimitBytes?: number;
}

/** A call on the task API, as CRI-O's ttrpc client makes it. */
export interface TaskApi {
  client: TtrpcClient;
  call<Q extends MessageName, R extends MessageName>(
    method: string,
    req: Q,
    value: MessageInput<Q>,
    res: R,
    timeoutMs?: number,
  ): Promise<Message<R>>;
  /** A method answering google.protobuf.Empty. */
  empty<Q extends MessageName>(method: string, req: Q, value: MessageInput<Q>, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

export interface CrioNode {
  dir: string;
  stateRoot: string;
  /** `kata-ts-test-<hex>`: the private cgroup root at the top of every hierarchy. */
  cgroupRoot: string;
  /** The pod's cgroup parent (cgroupfs): `/<cgroupRoot>/pod<uid>`. */
  cgroupParent: string;
  podUid: string;
  sandboxId: string;
  sandboxBundle: string;
  netns: JoinNamespaces;
  /** The pod's state dir and socket, where the shim keeps them. */
  podStateDir: string;
  socketPath: string;
  /** Lines the shim wrote to the sandbox bundle's log FIFO (CRI-O copies them to its own log). */
  shimLog(): string[];
  containerBundle(options: ContainerOptions): Promise<ContainerBundle>;
  /** The container's process with other args: what CRI-O sends as an exec's spec. */
  execProcess(container: ContainerBundle, args: string[]): Record<string, unknown>;
  /** `<shim> ... -id <id> <action>` as CRI-O runs it; stdout raw. */
  runShim(action: 'start' | 'delete', id: string, bundle: string): Promise<{ code: number; stdout: Buffer; stderr: string }>;
  connect(address: string): Promise<TaskApi>;
  /** mkfifo in CRI-O's fifo dir; its path. */
  makeFifo(name: string): Promise<string>;
  /** A FIFO (makeFifo) opened for reading, before the shim opens its end. */
  fifo(name: string): Promise<FifoReader>;
  /** Mount points under the test's directory. */
  mounts(): Promise<string[]>;
  cleanup(): Promise<void>;
}

function rewrite(text: string, map: ReadonlyArray<readonly [string, string]>): string {
  let out = text;
  for (const [from, to] of map) out = out.split(from).join(to);
  return out;
}

/** A busybox tree (the host's static busybox, an applet link each) at `dir`. */
async function writeBusyboxTree(dir: string): Promise<void> {
  await fsp.mkdir(dir, { recursive: true });
  for (const d of ['proc', 'sys', 'dev', 'run', 'root', 'etc', 'tmp']) await fsp.mkdir(path.join(dir, d), { recursive: true });
  const entries = [...busyboxBaseEntries(), ...APPLETS.map((a) => ({ name: `bin/${a}`, type: 'symlink' as const, linkname: 'busybox' }))];
  for (const e of entries) {
    const target = path.join(dir, e.name);
    if (e.type === 'directory') await fsp.mkdir(target, { recursive: true });
    else if (e.type === 'symlink') await fsp.symlink(e.linkname as string, target);
    else await fsp.writeFile(target, e.content as Buffer | string, { mode: e.mode ?? 0o644 });
  }
}

export async function createCrioNode(): Promise<CrioNode> {
  // Short: the pod's sockets live under it.
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ktc-'));
  const stateRoot = path.join(dir, 'shim');
  const cgroupRoot = `kata-ts-test-${randomBytes(5).toString('hex')}`;
  const podUid = [4, 2, 2, 2, 6].map((n) => randomBytes(n).toString('hex')).join('-');
  const cgroupParent = `/${cgroupRoot}/pod${podUid}`;
  const sandboxId = crioId();
  const runDir = path.join(dir, 'run', 'overlay-containers');
  const storage = path.join(dir, 'storage', 'overlay');
  const fifoDir = path.join(dir, 'fifo');
  const logDir = path.join(dir, 'log', 'pods');
  const kubeletDir = path.join(dir, 'kubelet', 'pods');
  const clients = new Set<TaskApi>();
  const readers = new Set<FifoReader>();
  let netns: JoinNamespaces | undefined;
  const logLines: string[] = [];

  const configPath = path.join(dir, 'kata-ts.json');
  const shimBin = path.join(dir, 'bin', 'containerd-shim-kata-ts-v2');

  const cleanup = async (): Promise<void> => {
    for (const c of clients) await c.close().catch(() => undefined);
    for (const r of readers) r.close();
    for (let i = 0; i < 50; i++) {
      const left = processesMentioning(dir);
      if (left.length === 0) break;
      for (const pid of left) {
        try {
          process.kill(pid, 'SIGKILL'); // only the test's own shim, QEMU and virtiofsd name its directory
        } catch {
          // gone
        }
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    await releaseSharedMounts(dir, silentLogger()).catch(() => undefined);
    await removeCgroupTree(cgroupRoot, 'kata-ts-test-');
    await netns?.cleanup();
    // KATA_TS_KEEP_TEST_DIR=1 keeps the shim's state and logs (debugging a failure).
    if (process.env.KATA_TS_KEEP_TEST_DIR !== '1') await fsp.rm(dir, { recursive: true, force: true });
  };

  try {
    // CRI-O's runtime_path: this one runs the repo's sources. No runtime mount namespace: CRI-O's
    // side here runs in the host's, where a bound namespace file would outlive a failed test (the
    // containerd tests cover the namespace).
    await installTestShim(shimBin, configPath, shimTestConfig(dir, stateRoot, { mountNamespacePath: null }));
    netns = await createJoinNamespaces();
    const ns = netns;
    const common: Array<readonly [string, string]> = [
      [FIXTURE.podUid, podUid],
      [FIXTURE.sandboxId, sandboxId],
      ['/var/run/containers/storage/overlay-containers', runDir],
      ['/var/lib/containers/storage/overlay', storage],
      ['/var/log/pods', logDir],
      ['/var/lib/kubelet/pods', kubeletDir],
      [`/var/run/netns/${FIXTURE.netnsId}`, ns.podPath],
      ['/var/run/ipcns', path.join(dir, 'ipcns')],
      ['/var/run/utsns', path.join(dir, 'utsns')],
    ];

    // The pause container: CRI-O's userdata dir holds the pod's resolv.conf, hostname and shm.
    const sandboxBundle = path.join(runDir, sandboxId, 'userdata');
    await fsp.mkdir(path.join(sandboxBundle, 'shm'), { recursive: true });
    await fsp.writeFile(path.join(sandboxBundle, 'resolv.conf'), `nameserver ${ns.gateway}\nsearch default.svc.cluster.local\n`);
    await fsp.writeFile(path.join(sandboxBundle, 'hostname'), 'crio-pod\n');
    const sandbox = JSON.parse(rewrite(readFileSync(path.join(FIXTURES, 'sandbox.config.synthetic.json'), 'utf8'), common)) as {
      hostname: string;
      annotations: Record<string, string>;
      linux: { cgroupsPath: string };
    };
    sandbox.hostname = 'crio-pod';
    sandbox.annotations['io.kubernetes.cri-o.HostName'] = 'crio-pod';
    // No pod-level resources (a BestEffort pod): the handler's default VM shape, as the containerd test boots.
    delete sandbox.annotations['io.kubernetes.cri-o.PodLinuxResources'];
    sandbox.linux.cgroupsPath = `${cgroupParent}/crio-${sandboxId}`;
    await fsp.writeFile(path.join(sandboxBundle, 'config.json'), JSON.stringify(sandbox, null, 2));
    await fsp.mkdir(path.join(logDir, `default_web-7d9f8c6b5-xk2lp_${podUid}`), { recursive: true });

    // CRI-O makes <bundle>/log before `start` and copies what comes out of it into its own log.
    const logFifo = path.join(sandboxBundle, 'log');
    await execFileAsync('mkfifo', ['-m', '0700', logFifo]);
    const logSocket = await openFifoSocket(logFifo, 'read');
    let partial = '';
    logSocket.on('data', (chunk: Buffer) => {
      const lines = (partial + chunk.toString()).split('\n');
      partial = lines.pop() ?? '';
      logLines.push(...lines);
    });
    logSocket.on('error', () => undefined);
    readers.add({ path: logFifo, text: () => '', ended: Promise.resolve(), close: () => logSocket.destroy() });

    const node: CrioNode = {
      dir,
      stateRoot,
      cgroupRoot,
      cgroupParent,
      podUid,
      sandboxId,
      sandboxBundle,
      netns: ns,
      podStateDir: podStateDir(stateRoot, CRIO_NAMESPACE, sandboxId),
      socketPath: shimSocketPath(stateRoot, '', CRIO_NAMESPACE, sandboxId),
      shimLog: () => [...logLines],

      async containerBundle(options) {
        const id = crioId();
        const bundle = path.join(runDir, id, 'userdata');
        const rootfs = path.join(storage, id, 'merged');
        await writeBusyboxTree(rootfs);
        const map: Array<readonly [string, string]> = [[FIXTURE.containerId, id], ...common, ['nginx', options.name]];
        const spec = JSON.parse(rewrite(readFileSync(path.join(FIXTURES, 'container.config.synthetic.json'), 'utf8'), map)) as {
          process: Record<string, unknown>;
          root: Record<string, unknown>;
          mounts: Array<{ destination: string; source: string }>;
          annotations: Record<string, string>;
          linux: { cgroupsPath: string; resources: Record<string, unknown>; seccomp?: unknown };
        };
        // The fixture's filter is abridged (a handful of syscalls); CRI-O writes its whole default
        // profile, which the shim passes on to the guest as it is: a whole default profile here.
        spec.linux.seccomp = runtimeDefaultProfile((spec.process.capabilities as { bounding?: string[] } | undefined)?.bounding ?? []);
        spec.process.user = { uid: 0, gid: 0 };
        spec.process.args = options.args;
        spec.process.env = ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOSTNAME=crio-pod'];
        spec.root = { path: rootfs };
        spec.annotations['io.kubernetes.cri-o.MountPoint'] = rootfs;
        spec.annotations['io.kubernetes.cri-o.Image'] = 'localhost/kata-ts/busybox:crio';
        spec.annotations['io.kubernetes.cri-o.ImageName'] = 'localhost/kata-ts/busybox:crio';
        spec.linux.cgroupsPath = `${cgroupParent}/crio-${id}`;
        spec.linux.resources = {
          devices: [{ allow: false, access: 'rwm' }],
          ...(options.memoryLimitBytes === undefined
            ? {}
            : { memory: { limit: options.memoryLimitBytes, swap: options.memoryLimitBytes } }),
        };
        // The host files CRI-O and the kubelet bind in (the pod's own hosts/hostname/resolv.conf/shm go to the guest's).
        for (const m of spec.mounts) {
          if (!m.source.startsWith(dir) || m.source.startsWith(path.join(runDir, sandboxId))) continue;
          if (m.destination.endsWith('serviceaccount')) {
            await fsp.mkdir(m.source, { recursive: true });
            await fsp.writeFile(path.join(m.source, 'token'), 'not-a-real-token\n');
          } else {
            await fsp.mkdir(path.dirname(m.source), { recursive: true });
            await fsp.writeFile(m.source, m.destination === '/etc/hosts' ? '127.0.0.1 localhost\n' : '');
          }
        }
        await fsp.mkdir(bundle, { recursive: true });
        await fsp.writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec, null, 2));
        // CRI-O makes a log FIFO for every container's `start`; only the pod's first start uses it.
        await execFileAsync('mkfifo', ['-m', '0700', path.join(bundle, 'log')]);
        return { id, bundle, rootfs, spec: spec as unknown as Record<string, unknown> };
      },

      execProcess(container, args) {
        return { ...(container.spec.process as Record<string, unknown>), args };
      },

      runShim(action, id, bundle) {
        return new Promise((resolve) => {
          const child = spawn(shimBin, ['-namespace', CRIO_NAMESPACE, '-address', '', '-publish-binary', CRIO_BINARY, '-id', id, action], {
            cwd: bundle,
            env: {
              ...process.env,
              GOMAXPROCS: '2',
              MAX_SHIM_VERSION: '2',
              TTRPC_ADDRESS: '',
              GRPC_ADDRESS: '',
              NAMESPACE: CRIO_NAMESPACE,
            },
            stdio: ['ignore', 'pipe', 'pipe'],
          });
          const out: Buffer[] = [];
          const err: Buffer[] = [];
          child.stdout.on('data', (c: Buffer) => out.push(c));
          child.stderr.on('data', (c: Buffer) => err.push(c));
          child.on('close', (code) => resolve({ code: code ?? -1, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString() }));
        });
      },

      async connect(address) {
        const client = await connectTtrpc(address.replace(/^unix:\/\//, ''));
        const metadata = { [NAMESPACE_METADATA_KEY]: CRIO_NAMESPACE };
        const raw = (method: string, bytes: Uint8Array, timeoutMs: number) =>
          client.call(TASK_SERVICE_V2, method, bytes, { timeoutMs, metadata });
        const api: TaskApi = {
          client,
          call: async (method, req, value, res, timeoutMs = 60_000) =>
            decodeMessage(res, await raw(method, encodeMessage(req, value), timeoutMs)),
          empty: async (method, req, value, timeoutMs = 60_000) => {
            await raw(method, encodeMessage(req, value), timeoutMs);
          },
          close: async () => {
            clients.delete(api);
            await client.close();
          },
        };
        clients.add(api);
        return api;
      },

      async makeFifo(name) {
        const sub = path.join(fifoDir, randomBytes(4).toString('hex'));
        await fsp.mkdir(sub, { recursive: true });
        const p = path.join(sub, name);
        await execFileAsync('mkfifo', ['-m', '0700', p]);
        return p;
      },

      async fifo(name) {
        const p = await node.makeFifo(name);
        const socket: net.Socket = await openFifoSocket(p, 'read');
        const chunks: Buffer[] = [];
        socket.on('data', (c: Buffer) => chunks.push(c));
        socket.on('error', () => undefined);
        const ended = new Promise<void>((resolve) => socket.once('end', () => resolve()));
        const reader: FifoReader = { path: p, text: () => Buffer.concat(chunks).toString(), ended, close: () => socket.destroy() };
        readers.add(reader);
        return reader;
      },

      mounts: async () => mountsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), dir),

      cleanup,
    };
    return node;
  } catch (err) {
    await cleanup();
    throw err;
  }
}
