/**
 * A kata-ts daemon run as a real process (`kata-ts serve`), in a temporary state dir, with the
 * cgroupfs driver placing VMMs under a private cgroup parent that the test owns, so tests can
 * restart it, kill its VMs, and check that nothing is left behind.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { shortIdKey } from '../../src/common/ids.js';
import { silentLogger } from '../../src/common/logger.js';
import { DEFAULT_VMM_LEASE_DIR } from '../../src/config/defaults.js';
import { boundNamespace, readNamespaceMountinfo, removeMountNamespace } from '../../src/runtime/mount-namespace.js';
import { poolVmRoot, sandboxVmRoot } from '../../src/runtime/sandbox/paths.js';
import { releaseSharedMounts } from '../../src/runtime/sandbox/shared-dir.js';
import { initTpmCa } from '../../src/tpm/ca.js';
import { mountedHierarchies, treeDeepestFirst } from './cgroups-private.js';
import { type CriClient, criClient } from './cri-client.js';
import { readLogLines, type SpawnedDaemon, spawnDaemon } from './daemon-process.js';
import { processesMentioning } from './hypervisor-guest.js';

const execFileAsync = promisify(execFile);

export interface TestRuntime {
  dir: string;
  /** Where the daemon's stderr (its JSON log) goes. */
  logFile: string;
  stateDir: string;
  socketPath: string;
  configPath: string;
  /** The runtime's mount namespace file (`<dir>/mntns/mnt`): the daemon makes its mounts there, not in the test's namespace. */
  mountNamespacePath: string;
  /** The mount table inside the runtime's mount namespace ('' before the daemon first made it). */
  mountinfo(): Promise<string>;
  /** Run a command inside the runtime's mount namespace (nsenter); its stdout. */
  inNamespace(argv: readonly string[]): Promise<string>;
  /** `kata-ts-test-<random>`: the private cgroup root every test pod's cgroup_parent starts with. */
  cgroupRoot: string;
  /** A cgroupfs-style cgroup_parent under the private root, as a kubelet would send for a pod. */
  cgroupParent(podUid: string): string;
  /** pool.cgroupParent (unless the config sets one): `/<cgroupRoot>/kata-ts-pool`, beside the pods. */
  poolCgroupParent: string;
  cri: CriClient;
  /** The running daemon's pid (changes across restart()). */
  pid(): number;
  /** The network namespace start() runs the daemon in (`nsenter --net=`); settable between starts. */
  netnsPath: string | undefined;
  start(): Promise<void>;
  /** SIGTERM and wait: what `systemctl stop` does. VMs keep running. */
  stop(): Promise<void>;
  restart(): Promise<void>;
  /** SIGKILL the daemon and wait (a crash: no shutdown code runs); start() brings it back. */
  crash(): Promise<void>;
  /** The daemon's JSON log lines so far. */
  logLines(): Promise<Array<Record<string, unknown>>>;
  /** Stop the daemon, kill any QEMU of this runtime, remove the private cgroups, the mount namespace and the temp dir. */
  cleanup(): Promise<void>;
}

export interface TestRuntimeOptions {
  /** Name prefix of the private cgroup root (must start with `kata-ts-`); benches use their own. */
  cgroupPrefix?: string;
  /** Prefix of the temporary directory under /tmp. */
  tmpPrefix?: string;
  /** Run the daemon in this network namespace (`nsenter --net=`), e.g. a test's "node" namespace. */
  netnsPath?: string;
  /**
   * Put the state dir on a tmpfs of this many MiB (the soak's full-disk fault fills it). Mounted
   * under the runtime's temp dir only, and unmounted by cleanup() with the sandboxes' mounts.
   */
  stateTmpfsMiB?: number;
}

/**
 * KATA_TS_GUEST_DIR (as for ensureGuestAssets): the guest (vmlinuz, initramfs, guest.img) the
 * daemon boots instead of the installed one, e.g. one built from a branch by build-guest.sh --out.
 */
export function guestDirConfig(): Record<string, unknown> {
  const dir = process.env.KATA_TS_GUEST_DIR;
  if (dir === undefined) return {};
  return {
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initramfs.cpio.gz'),
    guestImagePath: path.join(dir, 'guest.img'),
  };
}

export async function createTestRuntime(configDoc: Record<string, unknown> = {}, options: TestRuntimeOptions = {}): Promise<TestRuntime> {
  const cgroupPrefix = options.cgroupPrefix ?? 'kata-ts-test-';
  if (!cgroupPrefix.startsWith('kata-ts-')) throw new Error(`cgroup prefix ${cgroupPrefix} must start with kata-ts-`);
  // Short: sockets live under it and a unix socket path must fit in 108 bytes.
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), options.tmpPrefix ?? 'kts-'));
  const stateDir = path.join(dir, 'state');
  const socketPath = path.join(dir, 'kata-ts.sock');
  const configPath = path.join(dir, 'config.json');
  const mountNamespacePath = path.join(dir, 'mntns', 'mnt');
  const cgroupRoot = `${cgroupPrefix}${randomBytes(5).toString('hex')}`;
  // The pool's cgroup inside the private root too: nothing is made outside what the test owns.
  const pool = { cgroupParent: `/${cgroupRoot}/kata-ts-pool`, ...(configDoc.pool as Record<string, unknown> | undefined) };
  if (options.stateTmpfsMiB !== undefined) await mountTmpfs(stateDir, options.stateTmpfsMiB, 'kata-ts-state');
  // The node's TPM EK CA (vtpm pods: kata-ts-cvm's default on this host) inside the test's dir too,
  // unless the test names one: made as `kata-ts tpm-ca init` makes the node's (tens of ms).
  const hypervisorDoc = configDoc.hypervisor as Record<string, unknown> | undefined;
  const tpmDoc = hypervisorDoc?.tpm as Record<string, unknown> | undefined;
  const tpm = { ...tpmDoc, caDir: (tpmDoc?.caDir as string | undefined) ?? path.join(dir, 'tpm-ca') };
  if (tpmDoc?.caDir === undefined) await initTpmCa(tpm.caDir);
  await fsp.writeFile(
    configPath,
    JSON.stringify(
      {
        socketPath,
        stateDir,
        metricsAddress: null,
        cgroupDriver: 'cgroupfs',
        logLevel: 'debug',
        // No CNI unless a test brings its own config in a namespace of its own (test/helpers/network-node.ts):
        // the host's network is never touched by tests.
        network: { mode: 'none' },
        mountNamespacePath,
        ...configDoc,
        pool,
        hypervisor: { ...guestDirConfig(), ...hypervisorDoc, tpm },
      },
      null,
      2,
    ),
  );
  let daemon: SpawnedDaemon | undefined;
  let cri: CriClient | undefined;
  const logFile = path.join(dir, 'daemon.log');

  const runtime: TestRuntime = {
    dir,
    logFile,
    stateDir,
    socketPath,
    configPath,
    mountNamespacePath,
    async mountinfo() {
      return (await boundNamespace(mountNamespacePath)) === undefined ? '' : readNamespaceMountinfo(mountNamespacePath);
    },
    async inNamespace(argv) {
      const { stdout } = await execFileAsync('nsenter', [`--mount=${mountNamespacePath}`, '--', ...argv]);
      return stdout;
    },
    cgroupRoot,
    cgroupParent: (podUid) => `/${cgroupRoot}/pod${podUid}`,
    poolCgroupParent: pool.cgroupParent as string,
    get cri(): CriClient {
      if (cri === undefined) throw new Error('daemon not started');
      return cri;
    },
    pid: () => daemon?.pid ?? -1,
    netnsPath: options.netnsPath,
    async start() {
      const netnsPath = runtime.netnsPath;
      daemon = await spawnDaemon(configPath, socketPath, logFile, netnsPath === undefined ? {} : { netnsPath });
      cri = criClient(socketPath);
    },
    async stop() {
      cri?.close();
      cri = undefined;
      await daemon?.stop();
    },
    async restart() {
      await runtime.stop();
      await runtime.start();
    },
    async crash() {
      cri?.close();
      cri = undefined;
      await daemon?.kill();
    },
    logLines: () => readLogLines(logFile),
    async cleanup() {
      await runtime.stop();
      for (const pid of processesMentioning(dir)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await removeCgroupTree(cgroupRoot, cgroupPrefix);
      // The daemon's mounts (sandboxes' shared dirs, VMM jails) are in its namespace, which goes
      // (with them) once no process is in it.
      for (let i = 0; i < 50; i++) {
        if ((await removeMountNamespace(mountNamespacePath)).users.length === 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      // What is mounted in this namespace (a test's own tmpfs): released before deleting, or the
      // delete would fail on it.
      await releaseSharedMounts(dir, silentLogger());
      await releaseLeasesUnder(configPath, dir);
      // KATA_TS_KEEP_TEST_DIR=1 keeps the daemon's log, records and VM work dirs for a look.
      if (process.env.KATA_TS_KEEP_TEST_DIR === '1') console.warn(`kept the test runtime's dir ${dir}`);
      else await fsp.rm(dir, { recursive: true, force: true });
    },
  };
  return runtime;
}

/**
 * The VMM identity leases (node-wide, hypervisor.vmmIdentities.leaseDir) of this runtime's
 * sandboxes that were not removed through the CRI: stale once the records go with `dir` (the next
 * taker would take them over), removed here so that a test leaves nothing behind.
 */
async function releaseLeasesUnder(configPath: string, dir: string): Promise<void> {
  const config = JSON.parse(await fsp.readFile(configPath, 'utf8').catch(() => '{}')) as {
    hypervisor?: { vmmIdentities?: { leaseDir?: string } };
  };
  const leaseDir = config.hypervisor?.vmmIdentities?.leaseDir ?? DEFAULT_VMM_LEASE_DIR;
  for (const name of await fsp.readdir(leaseDir).catch(() => [] as string[])) {
    const file = path.join(leaseDir, name);
    const lease = JSON.parse(await fsp.readFile(file, 'utf8').catch(() => '{}')) as { record?: unknown };
    if (typeof lease.record === 'string' && lease.record.startsWith(`${dir}/`)) await fsp.rm(file, { force: true });
  }
}

/**
 * A new directory `dir` (0700) with a tmpfs of `mib` MiB on it: a small disk a test can fill.
 * Put it under a runtime's temp dir, whose cleanup() unmounts everything mounted there.
 */
export async function mountTmpfs(dir: string, mib: number, name: string): Promise<void> {
  await fsp.mkdir(dir, { mode: 0o700 });
  await execFileAsync('mount', ['-t', 'tmpfs', '-o', `size=${mib}m,mode=0700`, name, dir]);
}

/** Directories named `name` at the top of each hierarchy, deepest first; our QEMUs inside are killed. */
export async function cgroupDirsUnder(name: string): Promise<string[]> {
  const out: string[] = [];
  for (const m of await mountedHierarchies()) {
    const top = path.join(m.mountPoint, name);
    if (
      await fsp.stat(top).then(
        () => true,
        () => false,
      )
    )
      out.push(...(await treeDeepestFirst(top)));
  }
  return out;
}

/** Remove the cgroup `name` (it must start with `prefix`) from every hierarchy, deepest first, killing what is left in it (only a test's own QEMUs are ever placed there). */
export async function removeCgroupTree(name: string, prefix: string): Promise<void> {
  if (!name.startsWith(prefix)) throw new Error(`refusing to remove cgroup ${name}`);
  for (let attempt = 0; attempt < 50; attempt++) {
    const dirs = await cgroupDirsUnder(name);
    if (dirs.length === 0) return;
    for (const dir of dirs) {
      const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter((p) => p !== '');
      for (const pid of procs) {
        try {
          process.kill(Number(pid), 'SIGKILL'); // only this runtime's QEMUs were ever placed here
        } catch {
          // gone
        }
      }
      await fsp.rmdir(dir).catch(() => undefined);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Everything a sandbox leaves on the host, to assert it is all gone. */
export async function leftovers(
  runtime: TestRuntime,
  options: { vmmCgroupsOnly?: boolean } = {},
): Promise<{ processes: number[]; workDirs: string[]; records: string[]; cgroups: string[] }> {
  const list = async (d: string): Promise<string[]> => (await fsp.readdir(d).catch(() => [] as string[])).filter((n) => !n.startsWith('.'));
  return {
    processes: processesMentioning(path.join(runtime.stateDir, 'vm')),
    workDirs: await list(path.join(runtime.stateDir, 'vm')),
    records: (await list(path.join(runtime.stateDir, 'sandboxes'))).filter((n) => n.endsWith('.json')),
    // vmmCgroupsOnly: the VMMs' own `kata-ts-<sandbox id>` cgroups, not the pod parents above them.
    cgroups: (await cgroupDirsUnder(runtime.cgroupRoot)).filter((d) => !options.vmmCgroupsOnly || /\/kata-ts-[0-9a-f]{64}$/.test(d)),
  };
}

/**
 * The 16-hex keys (shortIdKey) of every sandbox and pooled VM this runtime made or began to make:
 * ids the test knows (RunPodSandbox answers), the records and work dirs of its state dir, and every
 * sandbox id and `kata-ts-<key>` name its own log mentions (a creation rolled back, or cut short by
 * a crash, leaves its id there and nowhere else). What a test may call its own on the machine's
 * shared places (/run/netns): another run's leftovers there are not this runtime's.
 */
export async function ownSandboxKeys(
  runtime: Pick<TestRuntime, 'stateDir' | 'logFile'>,
  knownIds: readonly string[] = [],
): Promise<string[]> {
  const keys = new Set(knownIds.map(shortIdKey));
  const names = async (d: string) => (await fsp.readdir(d).catch(() => [] as string[])).filter((n) => !n.startsWith('.'));
  for (const dir of ['sandboxes', 'pool']) {
    for (const n of await names(path.join(runtime.stateDir, dir)))
      if (n.endsWith('.json')) keys.add(shortIdKey(n.slice(0, -'.json'.length)));
  }
  for (const dir of [sandboxVmRoot(runtime.stateDir), poolVmRoot(runtime.stateDir)]) {
    for (const n of await names(dir)) if (/^[0-9a-f]{16}$/.test(n)) keys.add(n);
  }
  const log = await fsp.readFile(runtime.logFile, 'utf8').catch(() => '');
  for (const m of log.matchAll(/"(?:sandboxId|poolVmId|id)":"([^"]+)"/g)) keys.add(shortIdKey(m[1]!));
  for (const m of log.matchAll(/kata-ts-([0-9a-f]{16})\b/g)) keys.add(m[1]!);
  return [...keys].sort();
}

/** The pod network namespace names (`kata-ts-<key>`, as netnsNameFor) of ownSandboxKeys. */
export async function ownNetnsNames(
  runtime: Pick<TestRuntime, 'stateDir' | 'logFile'>,
  knownIds: readonly string[] = [],
): Promise<string[]> {
  return (await ownSandboxKeys(runtime, knownIds)).map((k) => `kata-ts-${k}`);
}

/** A minimal RunPodSandboxRequest.config for a pod with the given KEP-4112 containers. */
export function podConfig(runtime: TestRuntime, name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const uid = randomBytes(8).toString('hex');
  return {
    metadata: { name, namespace: 'kata-ts-test', uid, attempt: 0 },
    labels: { app: name, 'kata-ts.dev/test': 'true' },
    annotations: { 'kata-ts.dev/note': 'integration test' },
    log_directory: `/var/log/pods/kata-ts-test_${name}_${uid}`,
    linux: {
      cgroup_parent: runtime.cgroupParent(uid),
      security_context: { namespace_options: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } },
    },
    ...extra,
  };
}

/**
 * Pulls `image` while the daemon runs in the host's network namespace (the loopback registry
 * listens there; no pod exists yet), then restarts the daemon inside the node namespace at
 * `netnsPath` for good (test/helpers/network-node.ts): the pods' CNI runs there.
 */
export async function pullThenMoveIntoNode(runtime: TestRuntime, image: string, netnsPath: string): Promise<void> {
  await runtime.start();
  await runtime.cri.image.PullImage({ image: { image } });
  await runtime.stop();
  runtime.netnsPath = netnsPath;
  await runtime.start();
}
