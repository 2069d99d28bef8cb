/**
 * One conformance run, started by scripts/conformance.sh inside private mount, IPC and network
 * namespaces (loopback only), with KTC_WORK set to a fresh `/tmp/ktc-*` directory that holds
 * everything the run makes:
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
import { spawnDaemon } from '../../test/helpers/daemon-process.js';
import { startRegistry } from '../../test/helpers/images-registry.js';
import { guestDirConfig } from '../../test/helpers/runtime-daemon.js';
import { cleanupRun } from './cleanup.js';
import {
  closingLine,
  count,
  formatResults,
  judge,
  parseExpected,
  parseNotApplicable,
  parseReports,
  ratchetFails,
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
const repo = packageRoot();
const expectedFile = path.join(repo, 'test/conformance/expected.txt');
const naFile = path.join(repo, 'test/conformance/not-applicable.txt');
const offlineFile = path.join(repo, 'test/conformance/offline-limits.txt');

const say = (line: string) => process.stdout.write(`${line}\n`);

/** Runs a command to completion with output to `logFile` (and each stdout line to `onLine`); resolves with its exit code. */
function runLogged(
  cmd: string,
  args: string[],
  logFile: string,
  children: Set<ChildProcess>,
  onLine?: (line: string) => void,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const log = createWriteStream(logFile, { flags: 'a' });
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, GINKGO_NO_COLOR: 'TRUE' } });
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

async function main(): Promise<number> {
  if (!path.basename(work).startsWith('ktc-')) throw new Error('KTC_WORK must be a /tmp/ktc-* directory made by scripts/conformance.sh');
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
  const notApplicable = parseNotApplicable(await fsp.readFile(naFile, 'utf8'));
  const offline = parseNotApplicable(await fsp.readFile(offlineFile, 'utf8'));
  await fsp.mkdir(outDir, { recursive: true });
  const started = Date.now();

  const cgroupRoot = await setUpCgroupRoot();
  const registry = await startRegistry();
  say(`registry: ${registry.host} (pid ${registry.pid})`);
  const pushLog = path.join(outDir, 'images.log');
  await fsp.rm(pushLog, { force: true });
  const busybox = env.CONFORMANCE_BUSYBOX ? ['--busybox', env.CONFORMANCE_BUSYBOX] : [];
  const pushed = await runLogged('python3', [imagesScript, '--registry', registry.host, ...busybox], pushLog, children);
  if (pushed !== 0) throw new Error(`critest-images.py failed (exit ${pushed}); see ${pushLog}`);
  say(`images: pushed in ${((Date.now() - started) / 1000).toFixed(0)} s`);

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
        // KATA_TS_GUEST_DIR: a guest built from this tree (build-guest.sh --out) instead of the installed one.
        // Boots under TCG with other VMs on 2 cores took over the default 90 s to ready (3 critest
        // processes on a busy machine): wait up to just below critest's own 180 s rpc timeout.
        hypervisor: { ...guestDirConfig(), readyTimeoutMs: 170_000 },
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

  const endpoint = `unix://${socketPath}`;
  const base = [
    `-runtime-endpoint=${endpoint}`,
    `-image-endpoint=${endpoint}`,
    '-ginkgo.no-color',
    '-ginkgo.v',
    `-ginkgo.timeout=${suiteTimeout}`,
    '-runtime-service-timeout=180s',
    '-image-service-timeout=180s',
  ];
  const user = splitUserArgs(process.argv.slice(2));
  const plan = await critestArgs(critest, base, user, parallel, work, (cmd, args, log) => runLogged(cmd, args, log, children));
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
      await runLogged(critest, [...args, `-ginkgo.json-report=${report}`], log, children, (line) => {
        const done = progress.feed(line);
        if (done !== null) say(`  [${i + 1}] ${done}`);
      });
    }),
  );
  const critestSeconds = (Date.now() - critestStarted) / 1000;
  await daemon.stop();
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
  for (const line of formatResults(parsed, verdict, notApplicable, offline)) say(line);
  if (env.CONFORMANCE_UPDATE === '1' && verdict.newlyPassing.length > 0) {
    await fsp.writeFile(
      expectedFile,
      updatedExpected(
        await fsp.readFile(expectedFile, 'utf8'),
        verdict.newlyPassing.map((s) => s.name),
      ),
    );
    say(`added ${verdict.newlyPassing.length} specs to test/conformance/expected.txt`);
  }
  say('');
  say(
    `critest wall time: ${critestSeconds.toFixed(0)} s on ${plan.shards.length} process(es); whole run ${((Date.now() - started) / 1000).toFixed(0)} s`,
  );
  say(closingLine(count(parsed.specs)));
  if (parsed.suiteProblems.length > 0) return 2;
  if (ratchetFails(verdict)) return 1;
  if (env.CONFORMANCE_STRICT === '1' && verdict.newlyPassing.length > 0 && env.CONFORMANCE_UPDATE !== '1') return 1;
  return 0;
}

let code = 2;
try {
  code = await main();
} catch (err) {
  process.stderr.write(`conformance: ${err instanceof Error ? err.message : String(err)}\n`);
} finally {
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
