/**
 * One conformance run, started by scripts/conformance.sh inside private mount, IPC and network
 * namespaces (loopback only), with KTC_WORK set to a fresh `/tmp/ktc-*` directory that holds
 * everything the run makes. KTC_MODE picks what critest talks to:
 *
 * - `standalone` (default): kata-ts's own CRI server (`kata-ts serve`), steps 1 to 5 below;
 * - `containerd`: Debian's containerd 1.6.20 (test/helpers/containerd.ts: private root, state,
 *   config and socket in a "node" of its own network, mount and cgroup namespaces, nested in the
 *   run's) with this checkout's kata-ts shim as runtime handler `kata-ts` (a wrapper on
 *   containerd's PATH through a private bin dir, with its own config); containerd pulls the
 *   stand-ins through hosts.toml mirrors of registry.k8s.io and gcr.io to the loopback registry;
 *   its CNI is bridge + host-local + portmap inside the node; critest runs in the node's mount and
 *   network namespaces with `-runtime-handler kata-ts`; judged by test/conformance/containerd/;
 * - `runc`: the same containerd with its default runc runtime (no handler), the reference: judged
 *   by test/conformance/containerd/runc-reference.txt.
 *
 * The standalone run:
 *
 * 1. a private cgroup tree (`kata-ts-test-*` below this process's own cgroup, as the integration
 *    tests use) and a link root pointing at it, given to kata-ts as `cgroupRoot`: critest sends an
 *    empty cgroup_parent for the cgroupfs driver, so every VMM lands inside the private tree;
 * 2. Debian's docker-registry on 127.0.0.1 with the critest stand-in images pushed;
 * 3. `kata-ts serve` with its own config (socket, state dir, the runtime's mount namespace in the
 *    work dir, registry mirrors for registry.k8s.io and gcr.io, plain HTTP for 127.0.0.1), started
 *    in critest's mount namespace as a user starts it;
 * 4. critest (sharded over CONFORMANCE_PARALLEL processes when > 1) with JSON reports;
 * 5. the report, judged against test/conformance/expected.txt and not-applicable.txt.
 *
 * Exit status: 0 when the ratchet holds, 1 when it fails, 2 when the run itself broke.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { packageRoot } from '../../src/common/paths.js';
import { createPrivateCgroups } from '../../test/helpers/cgroups-private.js';
import { KATA_TS_HANDLER, startContainerd } from '../../test/helpers/containerd.js';
import { type ContainerdRelease, type ContainerdReleaseLabel, containerdRelease } from '../../test/helpers/containerd-releases.js';
import { spawnDaemon } from '../../test/helpers/daemon-process.js';
import { type RegistryHandle, startRegistry } from '../../test/helpers/images-registry.js';
import { guestDirConfig } from '../../test/helpers/runtime-daemon.js';
import { installTestShim, shimTestConfig } from '../../test/helpers/shim-config.js';
import { cleanupRun } from './cleanup.js';
import {
  closingLine,
  count,
  formatResults,
  judge,
  type NotApplicable,
  parseExpected,
  parseNotApplicable,
  parseReports,
  ratchetFails,
  referenceComparison,
  referenceFailures,
  referenceGap,
  updatedExpected,
} from './report.js';
import { critestArgs, ProgressLines, splitUserArgs } from './shards.js';

const env = process.env;
const work = env.KTC_WORK ?? '';
const critest = env.CRITEST ?? '';
const imagesScript = env.CRITEST_IMAGES ?? '';
const parallel = Math.max(1, Number(env.CONFORMANCE_PARALLEL ?? '1') || 1);
const outDir = env.CONFORMANCE_OUT ?? path.join('/tmp', 'kata-ts-conformance');
const suiteTimeout = env.CONFORMANCE_TIMEOUT ?? '45m';
/** Pooled VMs the standalone daemon keeps for handler kata-ts (CONFORMANCE_POOL; 0: no pool). */
const poolSize = Math.max(0, Math.min(64, Math.trunc(Number(env.CONFORMANCE_POOL ?? '0')) || 0));
const repo = packageRoot();

type Mode = 'standalone' | 'containerd' | 'runc';
const MODES: readonly Mode[] = ['standalone', 'containerd', 'runc'];
const RELEASES: readonly ContainerdReleaseLabel[] = ['1.6', '1.7', '2.1'];

/** The ratchet a mode is judged by (paths relative to the checkout). */
interface Ratchet {
  /** What the closing line calls the run. */
  label: string;
  dir: string;
  expected: string;
  /** null: nothing is exempt (the runc reference). */
  notApplicable: string | null;
  offline: string;
}

/**
 * The ratchets of every mode. Through containerd each release has its own folder: 1.6 keeps
 * test/conformance/containerd/ itself (its history), 1.7 and 2.1 have test/conformance/containerd/<release>/,
 * each with its own runc reference, since what containerd answers itself differs between releases.
 */
function ratchets(release: ContainerdReleaseLabel): Record<Mode, Ratchet> {
  const dir = release === '1.6' ? 'test/conformance/containerd' : `test/conformance/containerd/${release}`;
  return {
    standalone: {
      label: 'standalone',
      dir: 'test/conformance',
      expected: 'test/conformance/expected.txt',
      notApplicable: 'test/conformance/not-applicable.txt',
      offline: 'test/conformance/offline-limits.txt',
    },
    containerd: {
      label: release === '1.6' ? 'containerd' : `containerd ${release}`,
      dir,
      expected: `${dir}/expected.txt`,
      notApplicable: `${dir}/not-applicable.txt`,
      offline: `${dir}/offline-limits.txt`,
    },
    runc: {
      label: release === '1.6' ? 'containerd + runc reference' : `containerd ${release} + runc reference`,
      dir,
      expected: `${dir}/runc-reference.txt`,
      notApplicable: null,
      offline: `${dir}/offline-limits.txt`,
    },
  };
}

/** What critest talks to: its endpoint, how its command is wrapped, and how it is stopped. */
interface Target {
  endpoint: string;
  /** Flags for critest beyond the endpoints (e.g. the runtime handler). */
  args: string[];
  /** critest's deadline for every CRI call, above the VM's ready timeout. */
  rpcTimeoutS: number;
  /** The command line that runs `cmd args` where critest must run (e.g. in containerd's namespaces). */
  wrap(cmd: string, args: string[]): [string, string[]];
  /** Stops it; what could not be removed. */
  stop(): Promise<string[]>;
}

const say = (line: string) => process.stdout.write(`${line}\n`);

/** Runs a command to completion with output to `logFile` (and each stdout line to `onLine`); resolves with its exit code. */
function runLogged(
  cmd: string,
  args: string[],
  logFile: string,
  children: Set<ChildProcess>,
  onLine?: (line: string) => void,
  wrap: Target['wrap'] = (c, a) => [c, a],
): Promise<number> {
  const [command, argv] = wrap(cmd, args);
  return new Promise((resolve, reject) => {
    const log = createWriteStream(logFile, { flags: 'a' });
    const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, GINKGO_NO_COLOR: 'TRUE' } });
    children.add(child);
    if (onLine !== undefined) createInterface({ input: child.stdout! }).on('line', onLine);
    child.stdout!.pipe(log, { end: false });
    child.stderr!.pipe(log, { end: false });
    child.once('error', reject);
    child.once('close', (code, signal) => {
      children.delete(child);
      log.end();
      resolve(code ?? (signal !== null ? 128 : 1));
    });
  });
}

async function setUpCgroupRoot(): Promise<string> {
  const pc = await createPrivateCgroups();
  await fsp.writeFile(path.join(work, 'cgroup-name'), pc.name);
  const root = path.join(work, 'cgroup-root');
  await fsp.mkdir(root);
  for (const h of pc.hierarchies) await fsp.symlink(h.dir, path.join(root, h.name));
  return root;
}

/** kata-ts's own CRI server (`kata-ts serve`) with a config of its own: steps 1 and 3 of the file's comment. */
async function startStandalone(registry: RegistryHandle): Promise<Target> {
  const cgroupRoot = await setUpCgroupRoot();
  const registriesFile = path.join(work, 'registries.json');
  await fsp.writeFile(
    registriesFile,
    JSON.stringify({
      registries: {
        'registry.k8s.io': { mirrors: [registry.host] },
        'gcr.io': { mirrors: [registry.host] },
        '127.0.0.1:*': { plainHttp: true },
      },
    }),
  );
  const network = await writeCniConfig(work);
  const socketPath = path.join(work, 'kata-ts.sock');
  const configPath = path.join(work, 'config.json');
  const daemonLog = path.join(outDir, 'daemon.log');
  await fsp.rm(daemonLog, { force: true });
  await fsp.writeFile(
    configPath,
    JSON.stringify(
      {
        socketPath,
        stateDir: path.join(work, 'state'),
        mountNamespacePath: path.join(work, 'mntns', 'mnt'),
        metricsAddress: null,
        logLevel: 'info',
        cgroupDriver: 'cgroupfs',
        cgroupRoot,
        images: { registriesConfigPath: registriesFile },
        network,
        hypervisor: conformanceHypervisor(),
        // Under cgroupRoot, the pool's cgroup is inside the run's private tree like the pods'.
        ...(poolSize > 0 ? { pool: { sizes: { 'kata-ts': poolSize } } } : {}),
      },
      null,
      2,
    ),
  );
  // Started as a user starts it, in critest's mount namespace (the run's, rshared like a systemd
  // host's): `kata-ts serve` makes the runtime's own namespace, a slave of it, at
  // mountNamespacePath and runs the daemon there, so critest's host mounts reach the daemon and
  // none of the daemon's reach critest (a copy of a volume's submount in critest's namespace kept
  // the submount's directory unremovable, EBUSY, while the container existed).
  const daemon = await spawnDaemon(configPath, socketPath, daemonLog);
  say(`kata-ts: pid ${daemon.pid}, socket ${socketPath}, log ${daemonLog}`);
  return {
    endpoint: `unix://${socketPath}`,
    args: [],
    rpcTimeoutS: 180,
    wrap: (c, a) => [c, a],
    stop: async () => {
      await daemon.stop();
      return [];
    },
  };
}

/**
 * The VM settings of both kata-ts runs (KATA_TS_GUEST_DIR: a guest built from this tree by
 * build-guest.sh --out instead of the installed one). Boots under TCG with other VMs on 2 cores
 * took over the default 90 s to ready (3 critest processes on a busy machine): wait up to just
 * below critest's own 180 s rpc timeout.
 */
function conformanceHypervisor(readyTimeoutMs = 170_000): Record<string, unknown> {
  return { ...guestDirConfig(), readyTimeoutMs };
}

/**
 * containerd 1.6.20 in a node of its own (test/helpers/containerd.ts), nested in the run's
 * namespaces, with this checkout's shim as handler `kata-ts` when `withShim`; critest runs in the
 * node's mount and network namespaces, where containerd's socket, the pods' IPs, the host ports
 * (portmap) and its streaming server live, and where critest's host-side bind mounts must be made.
 */
async function startContainerdTarget(registry: RegistryHandle, withShim: boolean, release: ContainerdRelease | null): Promise<Target> {
  const binDir = path.join(work, 'bin');
  await fsp.mkdir(binDir);
  if (withShim) {
    const shimDir = path.join(work, 'shim');
    await fsp.mkdir(shimDir);
    await installTestShim(
      path.join(binDir, 'containerd-shim-kata-ts-v2'),
      path.join(shimDir, 'config.json'),
      shimTestConfig(shimDir, path.join(shimDir, 'state'), { logLevel: 'info', hypervisor: conformanceHypervisor(240_000) }),
      // conformance.sh built dist/ from this checkout: the shim starts as an installed one does.
      // CONFORMANCE_SHIM_TSX=1 runs the sources through tsx instead (dist/ left as it is).
      env.CONFORMANCE_SHIM_TSX !== '1',
    );
  }
  const shimPath = path.join(binDir, 'containerd-shim-kata-ts-v2');
  // containerd 2.x asks a handler for its OCI features (`-info`; recursive read-only mounts) only
  // when it is runc-typed (2.1.9): the kata-ts handler is written so, naming the same shim by path
  // (docs/shim.md "Runtime info"). CONFORMANCE_INTROSPECT=0 writes it as installs do.
  const introspect = withShim && release !== null && release.version.major >= 2 && env.CONFORMANCE_INTROSPECT !== '0';
  const containerd = await startContainerd({
    registry,
    ...(introspect ? { kataShimPath: shimPath } : {}),
    // critest's own pause name: pulled through the mirror like every other stand-in.
    sandboxImage: 'registry.k8s.io/pause:3.10',
    shimBinDir: binDir,
    mirrorDomains: ['registry.k8s.io', 'gcr.io'],
    cniPortmap: true,
    // 1.6 is the containerd on PATH, as before; 1.7 and 2.1 are the fetched releases.
    ...(release === null ? {} : { release }),
  });
  // cleanup.ts removes this tree too, should the driver be killed before stop().
  await fsp.writeFile(path.join(work, 'cgroup-name'), containerd.cgroups.name);
  say(
    `containerd ${containerd.version.major}.${containerd.version.minor}.${containerd.version.patch}: pid ${containerd.pid}, socket ${containerd.criSocket}${withShim ? `, handler ${KATA_TS_HANDLER}${introspect ? ' (runc-typed, runtime_path: the shim, so containerd asks its -info)' : ''}` : ', runc'}`,
  );
  const logFile = path.join(outDir, 'containerd.log');
  return {
    endpoint: `unix://${containerd.criSocket}`,
    args: withShim ? [`-runtime-handler=${KATA_TS_HANDLER}`] : [],
    // containerd pulls the sandbox image, runs CNI and starts a shim process before the VM boots
    // (all inside critest's deadline): critest's default 300 s, the VM's ready timeout below it.
    rpcTimeoutS: 300,
    wrap: (c, a) => ['nsenter', [`--target=${containerd.nodePid}`, '--mount', '--net', '--', c, ...a]],
    stop: async () => {
      await fsp.writeFile(logFile, containerd.logText()).catch(() => undefined);
      const report = await containerd.stop();
      if (report.strays.length > 0) say(`containerd left running (killed): ${report.strays.join(', ')}`);
      return report.leftovers;
    },
  };
}

let stopTarget: (() => Promise<string[]>) | undefined;

async function readRatchet(file: string | null): Promise<NotApplicable[]> {
  return file === null ? [] : parseNotApplicable(await fsp.readFile(path.join(repo, file), 'utf8'));
}

async function main(): Promise<number> {
  if (!path.basename(work).startsWith('ktc-')) throw new Error('KTC_WORK must be a /tmp/ktc-* directory made by scripts/conformance.sh');
  const mode = (env.KTC_MODE ?? 'standalone') as Mode;
  if (!MODES.includes(mode)) throw new Error(`KTC_MODE must be one of ${MODES.join(', ')}, not ${mode}`);
  const releaseLabel = (env.CONFORMANCE_CONTAINERD ?? '1.6') as ContainerdReleaseLabel;
  if (!RELEASES.includes(releaseLabel))
    throw new Error(`CONFORMANCE_CONTAINERD must be one of ${RELEASES.join(', ')}, not ${releaseLabel}`);
  const RATCHETS = ratchets(releaseLabel);
  const ratchet = RATCHETS[mode];
  let release: ContainerdRelease | null = null;
  if (mode !== 'standalone' && releaseLabel !== '1.6') {
    const resolved = await containerdRelease(releaseLabel);
    if (resolved.release === null) throw new Error(`containerd ${releaseLabel} cannot run here: ${resolved.missing}`);
    release = resolved.release;
    say(`containerd ${releaseLabel}: ${release.versionText} (${release.source})`);
  }
  const expectedFile = path.join(repo, ratchet.expected);
  const children = new Set<ChildProcess>();
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    say(`\nconformance: ${signal}, stopping critest and cleaning up`);
    for (const c of children) c.kill('SIGKILL');
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const expected = parseExpected(await fsp.readFile(expectedFile, 'utf8'));
  const notApplicable = await readRatchet(ratchet.notApplicable);
  const offline = await readRatchet(ratchet.offline);
  // The reference: specs containerd + runc passes on this machine kind, each of which the kata-ts
  // handler must pass unless not-applicable.txt says why a VM cannot.
  const reference = mode === 'containerd' ? parseExpected(await fsp.readFile(path.join(repo, RATCHETS.runc.expected), 'utf8')) : [];
  await fsp.mkdir(outDir, { recursive: true });
  const started = Date.now();

  const registry = await startRegistry();
  say(`registry: ${registry.host} (pid ${registry.pid})`);
  const pushLog = path.join(outDir, 'images.log');
  await fsp.rm(pushLog, { force: true });
  const busybox = env.CONFORMANCE_BUSYBOX ? ['--busybox', env.CONFORMANCE_BUSYBOX] : [];
  const pushed = await runLogged('python3', [imagesScript, '--registry', registry.host, ...busybox], pushLog, children);
  if (pushed !== 0) throw new Error(`critest-images.py failed (exit ${pushed}); see ${pushLog}`);
  say(`images: pushed in ${((Date.now() - started) / 1000).toFixed(0)} s`);

  const target =
    mode === 'standalone' ? await startStandalone(registry) : await startContainerdTarget(registry, mode === 'containerd', release);
  stopTarget = target.stop;

  const base = [
    `-runtime-endpoint=${target.endpoint}`,
    `-image-endpoint=${target.endpoint}`,
    ...target.args,
    '-ginkgo.no-color',
    '-ginkgo.v',
    `-ginkgo.timeout=${suiteTimeout}`,
    `-runtime-service-timeout=${target.rpcTimeoutS}s`,
    `-image-service-timeout=${target.rpcTimeoutS}s`,
  ];
  const user = splitUserArgs(process.argv.slice(2));
  const plan = await critestArgs(critest, base, user, parallel, work, (cmd, args, log) =>
    runLogged(cmd, args, log, children, undefined, target.wrap),
  );
  say(`critest: ${plan.specCount} specs on ${plan.shards.length} process(es); logs in ${outDir}/critest-*.log`);
  const critestStarted = Date.now();
  const reports: string[] = [];
  await Promise.all(
    plan.shards.map(async (args, i) => {
      const report = path.join(work, `report-${i + 1}.json`);
      const log = path.join(outDir, `critest-${i + 1}.log`);
      await fsp.rm(log, { force: true });
      reports.push(report);
      const progress = new ProgressLines();
      await runLogged(
        critest,
        [...args, `-ginkgo.json-report=${report}`],
        log,
        children,
        (line) => {
          const done = progress.feed(line);
          if (done !== null) say(`  [${i + 1}] ${done}`);
        },
        target.wrap,
      );
    }),
  );
  const critestSeconds = (Date.now() - critestStarted) / 1000;
  stopTarget = undefined;
  const left = await target.stop();
  if (left.length > 0) throw new Error(`stopping the runtime left:\n  ${left.join('\n  ')}`);
  if (stopping) return 130;

  const docs: unknown[] = [];
  for (const r of reports) {
    const text = await fsp.readFile(r, 'utf8').catch(() => null);
    if (text === null) throw new Error(`critest wrote no report ${r}; see ${outDir}/critest-*.log`);
    docs.push(JSON.parse(text));
    await fsp.copyFile(r, path.join(outDir, path.basename(r)));
  }
  const parsed = parseReports(docs);
  const verdict = judge(parsed.specs, expected, notApplicable, offline);
  say('');
  for (const line of formatResults(parsed, verdict, notApplicable, offline, ratchet.dir, ratchet.expected)) say(line);
  if (mode === 'containerd') {
    for (const line of referenceGap(parsed.specs, reference, notApplicable, RATCHETS.runc.expected)) say(line);
    say('');
    say(referenceComparison(parsed.specs, reference, notApplicable));
  }
  if (env.CONFORMANCE_UPDATE === '1' && verdict.newlyPassing.length > 0) {
    await fsp.writeFile(
      expectedFile,
      updatedExpected(
        await fsp.readFile(expectedFile, 'utf8'),
        verdict.newlyPassing.map((s) => s.name),
      ),
    );
    say(`added ${verdict.newlyPassing.length} specs to ${ratchet.expected}`);
  }
  say('');
  say(
    `critest wall time: ${critestSeconds.toFixed(0)} s on ${plan.shards.length} process(es); whole run ${((Date.now() - started) / 1000).toFixed(0)} s`,
  );
  say(closingLine(count(parsed.specs), ratchet.label));
  if (parsed.suiteProblems.length > 0) return 2;
  if (ratchetFails(verdict)) return 1;
  // kata-ts must pass every reference spec that ran, apart from those a VM cannot (not-applicable.txt).
  if (mode === 'containerd' && referenceFailures(parsed.specs, reference, notApplicable).length > 0) return 1;
  if (env.CONFORMANCE_STRICT === '1' && verdict.newlyPassing.length > 0 && env.CONFORMANCE_UPDATE !== '1') return 1;
  return 0;
}

let code = 2;
try {
  code = await main();
} catch (err) {
  process.stderr.write(`conformance: ${err instanceof Error ? err.message : String(err)}\n`);
} finally {
  if (stopTarget !== undefined) {
    const leftByTarget = await stopTarget().catch((err: unknown) => [String(err)]);
    if (leftByTarget.length > 0) process.stderr.write(`conformance: stopping the runtime left:\n  ${leftByTarget.join('\n  ')}\n`);
  }
  const left = await cleanupRun(work).catch((err: unknown) => [String(err)]);
  if (left.length > 0) {
    process.stderr.write(`conformance: cleanup left:\n  ${left.join('\n  ')}\n`);
    code = 2;
  }
}
process.exit(code);

/**
 * The node's CNI network for the run: bridge + host-local + portmap, as a kubelet node has one.
 * The run lives in a network namespace of its own (conformance.sh's `unshare --net`), so the
 * bridge, its private subnet and portmap's iptables rules exist only there, and critest, which
 * runs in the same namespace, reaches pod IPs and host ports the way a node does. host-local keeps
 * its allocations in the run's work directory.
 */
async function writeCniConfig(work: string): Promise<{ mode: 'cni'; cniConfDir: string; cniBinDirs: string[] }> {
  const cniConfDir = path.join(work, 'cni', 'net.d');
  await fsp.mkdir(cniConfDir, { recursive: true });
  const conflist = {
    cniVersion: '1.0.0',
    name: 'kata-ts-conformance',
    plugins: [
      {
        type: 'bridge',
        bridge: 'ktc0',
        isGateway: true,
        ipMasq: false,
        hairpinMode: true,
        ipam: {
          type: 'host-local',
          dataDir: path.join(work, 'cni', 'ipam'),
          ranges: [[{ subnet: '10.244.0.0/24', gateway: '10.244.0.1' }]],
          routes: [{ dst: '0.0.0.0/0' }],
        },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  };
  await fsp.writeFile(path.join(cniConfDir, '10-kata-ts-conformance.conflist'), JSON.stringify(conflist, null, 2));
  return { mode: 'cni', cniConfDir, cniBinDirs: ['/opt/cni/bin', '/usr/lib/cni'] };
}
