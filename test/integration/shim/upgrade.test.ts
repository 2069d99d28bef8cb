/**
 * An upgrade under running pods, behind the real containerd (Debian's 1.6.20, started privately by
 * test/helpers/containerd.ts): kata-ts is installed as release A into a prefix of the test's own
 * (`kata-ts release install`), whose bin dir is on containerd's PATH; a pod runs on A; release B
 * (the same build, told apart by its version) is installed by A's own `kata-ts` while that pod
 * runs; a second pod runs on B. Both generations run side by side on one containerd: each pod's
 * shim runs from its own release's real directory (its command line, and the release its code
 * found itself in, recorded in shim.json), both answer an exec, `release prune` keeps A while its
 * pod runs and removes it once the pod is gone, and both pods stop and go cleanly. Two VM boots.
 *
 * The releases are built from this checkout's sources (tsc into the test dir), so the test runs
 * the code under test, not whatever dist/ holds. Skipped with a notice when containerd (or runc,
 * the CNI plugins) is not installed.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { main as cliMain } from '../../../src/cli/main.js';
import { packageRoot } from '../../../src/common/paths.js';
import { readCmdline } from '../../../src/common/procfs.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { readShimInfo, type ShimInfo } from '../../../src/shim/paths.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { type ContainerdHandle, containerdMissing, KATA_TS_HANDLER, startContainerd } from '../../helpers/containerd.js';
import { type CriClient, criClient } from '../../helpers/cri-client.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { until } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { shimTestConfig } from '../../helpers/shim-config.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`kata-ts upgrade behind containerd skipped: ${MISSING}`);

const cmdline = (pid: number) => readCmdline(pid);

/** A built kata-ts tree of this checkout at `dir`: package.json (version given), bin/, proto/, node_modules (linked); dist/ (tsc, the jailer) follows. */
async function buildTree(dir: string, version: string): Promise<void> {
  const root = packageRoot();
  await fsp.mkdir(dir, { recursive: true });
  const pkg = JSON.parse(await fsp.readFile(path.join(root, 'package.json'), 'utf8')) as Record<string, unknown>;
  await fsp.writeFile(path.join(dir, 'package.json'), `${JSON.stringify({ ...pkg, version }, null, 2)}\n`);
  await fsp.cp(path.join(root, 'bin'), path.join(dir, 'bin'), { recursive: true, verbatimSymlinks: true });
  await fsp.cp(path.join(root, 'proto'), path.join(dir, 'proto'), { recursive: true });
  await fsp.symlink(path.join(root, 'node_modules'), path.join(dir, 'node_modules'));
}

describe.skipIf(MISSING !== null)('an upgrade under running pods: two kata-ts releases side by side on containerd 1.6.20', () => {
  let registry: RegistryHandle | undefined;
  let ctrd: ContainerdHandle | undefined;
  let cri: CriClient | undefined;
  let image = '';
  let dir = '';
  let prefix = '';
  let binDir = '';
  let stateRoot = '';
  let configPath = '';
  let logDir = '';
  let releaseA = '';
  let releaseB = '';
  const uids: Record<string, string> = { one: randomUUID(), two: randomUUID() };

  const sandboxConfig = (name: string): PodSandboxConfig => ({
    metadata: { name, uid: uids[name]!, namespace: 'default', attempt: 0 },
    hostname: name,
    log_directory: logDir,
    linux: { cgroup_parent: `/kubepods/burstable/pod${uids[name]!}` },
  });
  const pods: Array<{ name: string; podId: string; appId: string }> = [];
  const shimInfo = async (podId: string): Promise<ShimInfo> => {
    const info = await readShimInfo(path.join(stateRoot, 'k8s.io', podId.slice(0, 16)));
    if (info === undefined) throw new Error(`no shim.json for pod ${podId}`);
    return info;
  };
  /** The installed `kata-ts` (through the bin dir's link, so the current release's CLI). */
  const kataTs = async (...argv: string[]) => (await execFileAsync(path.join(binDir, 'kata-ts'), argv, { timeout: 300_000 })).stdout;
  const releaseArgs = () => ['--prefix', prefix, '--state-root', stateRoot];

  /** A pod on the kata-ts handler with one long-running container; returns its ids. */
  async function runPod(name: string): Promise<{ name: string; podId: string; appId: string }> {
    const podId = (
      await cri!.runtime.RunPodSandbox(
        { config: sandboxConfig(name), runtime_handler: KATA_TS_HANDLER },
        { deadline: Date.now() + scaledMs(240_000) },
      )
    ).pod_sandbox_id;
    const pod = { name, podId, appId: '' };
    pods.push(pod);
    pod.appId = (
      await cri!.runtime.CreateContainer({
        pod_sandbox_id: podId,
        config: {
          metadata: { name: 'app', attempt: 0 },
          image: { image },
          command: ['sh', '-c', 'while :; do sleep 1 & wait $!; done'],
          log_path: `${name}-app.log`,
        },
        sandbox_config: sandboxConfig(name),
      })
    ).container_id;
    await cri!.runtime.StartContainer({ container_id: pod.appId });
    return pod;
  }

  /**
   * An exec through containerd, as `[stdout, exit code]`. On this shared two-core machine (TCG, load
   * around 18 measured during these runs) a guest busy right after its boot has answered a first
   * exec with exit 255 and no output, or past the exec's deadline: the exec is asked again until it
   * answers (each failed answer noted), and what it answers is then asserted as it is.
   */
  const exec = (appId: string, word: string) =>
    until(
      `an exec in ${appId.slice(0, 12)} to answer`,
      async (note) => {
        try {
          const res = await cri!.runtime.ExecSync({ container_id: appId, cmd: ['echo', word], timeout: 60 });
          const answer = [res.stdout.toString(), res.exit_code];
          if (res.exit_code === 255 && res.stdout.length === 0) {
            note(answer);
            return undefined;
          }
          return answer;
        } catch (err) {
          const { status } = await cri!.runtime.ContainerStatus({ container_id: appId }).catch(() => ({ status: undefined }));
          // A container that is gone will not answer: fail now, saying so.
          if (status?.state !== 'CONTAINER_RUNNING')
            throw new Error(`exec in ${appId} failed: ${String(err)}; status ${JSON.stringify(status)}`);
          note(String(err));
          return undefined;
        }
      },
      scaledMs(180_000),
      1_000,
    );

  /** Remove the pod through containerd and wait for its shim to exit. */
  async function removePod(pod: { podId: string; appId: string }): Promise<void> {
    const { pid } = await shimInfo(pod.podId);
    await cri!.runtime.StopContainer({ container_id: pod.appId, timeout: 10 });
    await cri!.runtime.RemoveContainer({ container_id: pod.appId });
    await cri!.runtime.StopPodSandbox({ pod_sandbox_id: pod.podId });
    await cri!.runtime.RemovePodSandbox({ pod_sandbox_id: pod.podId });
    await until('the shim to exit (Shutdown with no task left)', async (note) => {
      note(isRunning(pid));
      return isRunning(pid) ? undefined : true;
    });
    expect(existsSync(path.join(stateRoot, 'k8s.io', pod.podId.slice(0, 16)))).toBe(false);
  }

  beforeAll(async () => {
    dir = await fsp.mkdtemp('/tmp/ktup-');
    prefix = path.join(dir, 'opt', 'kata-ts');
    binDir = path.join(dir, 'bin');
    stateRoot = path.join(dir, 'shim');
    configPath = path.join(dir, 'kata-ts.json');
    // Two pod VMs run at once under TCG on a shared machine: the guest gets the harness's time scale to boot.
    const config = shimTestConfig(dir, stateRoot, {
      mountNamespacePath: path.join(dir, 'mntns', 'mnt'),
      hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(240_000) },
    });
    await fsp.writeFile(configPath, JSON.stringify(config));
    // Two builds of this checkout, told apart by their version (so by their content hash too).
    const treeA = path.join(dir, 'tree-a');
    await buildTree(treeA, '0.0.0-upgrade.a');
    await execFileAsync(process.execPath, [
      path.join(packageRoot(), 'node_modules', 'typescript', 'bin', 'tsc'),
      '-p',
      path.join(packageRoot(), 'tsconfig.build.json'),
      '--outDir',
      path.join(treeA, 'dist'),
    ]);
    // The jailer every confined QEMU starts through, as setup builds it beside the compiled code.
    await fsp.cp(path.join(packageRoot(), 'dist', 'native'), path.join(treeA, 'dist', 'native'), { recursive: true });
    const treeB = path.join(dir, 'tree-b');
    await fsp.cp(treeA, treeB, { recursive: true, verbatimSymlinks: true });
    const pkgB = JSON.parse(await fsp.readFile(path.join(treeB, 'package.json'), 'utf8')) as Record<string, unknown>;
    await fsp.writeFile(path.join(treeB, 'package.json'), JSON.stringify({ ...pkgB, version: '0.0.0-upgrade.b' }));
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata-ts/busybox', 'upgrade', ['sleep']);
    ctrd = await startContainerd({ registry, shimBinDir: binDir, env: { KATA_TS_CONFIG: configPath } });
    cri = criClient(ctrd.criSocket);
    logDir = path.join(ctrd.dir, 'pods', 'upgrade');
    await fsp.mkdir(logDir, { recursive: true });
    await cri.image.PullImage({ image: { image } });
  });

  afterAll(async () => {
    cri?.close();
    const report = await ctrd?.stop();
    await registry?.stop();
    // A pod VM or shim left by a failed test: its QEMU, virtiofsd and shim name the state root or the prefix.
    for (const needle of [stateRoot, prefix]) {
      if (needle !== '') for (const pid of liveProcessesMentioning(needle)) process.kill(pid, 'SIGKILL');
    }
    if (dir !== '' && process.env.KATA_TS_KEEP_TEST_DIR !== '1') await fsp.rm(dir, { recursive: true, force: true });
    if (report !== undefined && report.leftovers.length > 0) throw new Error(`the containerd harness left: ${report.leftovers.join('; ')}`);
  });

  it('release A installed: the bin dir on containerd PATH links through current to A', async () => {
    const out: string[] = [];
    const io = {
      stdout: { write: (s: string) => out.push(s) > 0 } as unknown as NodeJS.WritableStream,
      stderr: { write: (s: string) => out.push(s) > 0 } as unknown as NodeJS.WritableStream,
    };
    const code = await cliMain(['release', 'install', '--prefix', prefix, '--bin-dir', binDir, '--from', path.join(dir, 'tree-a')], io);
    expect(code, out.join('')).toBe(0);
    releaseA = (await fsp.readdir(path.join(prefix, 'releases')))[0] ?? '';
    expect(releaseA).toMatch(/^0\.0\.0-upgrade\.a-[0-9a-f]{12}$/);
    expect(out.join('')).toContain(`release ${releaseA} is current`);
    // containerd execs the native start front of A, which hands what it does not answer to A's Node shim.
    expect(await fsp.realpath(path.join(binDir, 'containerd-shim-kata-ts-v2'))).toBe(
      path.join(prefix, 'releases', releaseA!, 'dist', 'native', 'kata-ts-shim-start'),
    );
  });

  /** A test that boots a pod VM: TCG on a shared two-core machine. */
  const BOOT = scaledMs(480_000);

  it(
    "pod 1 runs on A: its shim's command line and shim.json name A's real directory",
    async () => {
      const pod = await runPod('one');
      const info = await shimInfo(pod.podId);
      const dirA = path.join(prefix, 'releases', releaseA);
      expect(info.release).toEqual({ id: releaseA, dir: dirA });
      expect(cmdline(info.pid)).toContain(path.join(dirA, 'bin', 'containerd-shim-kata-ts-v2'));
      expect(cmdline(info.pid).at(-1)).toBe('serve');
      expect(await exec(pod.appId, 'one on A')).toEqual(['one on A\n', 0]);
    },
    BOOT,
  );

  it(
    "release B installed by A's own kata-ts while pod 1 runs: current flips, pod 1's shim is untouched",
    async () => {
      const before = await shimInfo(pods[0]!.podId);
      const out = await kataTs('release', 'install', '--prefix', prefix, '--bin-dir', binDir, '--from', path.join(dir, 'tree-b'));
      releaseB = (await fsp.readdir(path.join(prefix, 'releases'))).find((r) => r !== releaseA) ?? '';
      expect(releaseB).toMatch(/^0\.0\.0-upgrade\.b-[0-9a-f]{12}$/);
      expect(out).toContain(`point ${prefix}/current at releases/${releaseB} (was releases/${releaseA})`);
      expect(out).toMatch(/copied \d+\/\d+ files/);
      // The links go through current: nothing else changed.
      expect(out).not.toContain('link ');
      expect(await fsp.readlink(path.join(prefix, 'current'))).toBe(`releases/${releaseB}`);
      // The same install again changes nothing.
      expect(await kataTs('release', 'install', '--prefix', prefix, '--bin-dir', binDir, '--from', path.join(dir, 'tree-b'))).toContain(
        'nothing changed',
      );
      const after = await shimInfo(pods[0]!.podId);
      expect(after).toEqual(before);
      expect(isRunning(before.pid)).toBe(true);
      // The old shim still serves: an exec takes its (lazily loaded) exec path, from A.
      expect(await exec(pods[0]!.appId, 'one after the upgrade')).toEqual(['one after the upgrade\n', 0]);
    },
    BOOT,
  );

  it(
    'pod 2 runs on B beside pod 1 on A; list shows both generations; prune keeps both',
    async () => {
      const pod = await runPod('two');
      const info = await shimInfo(pod.podId);
      const dirB = path.join(prefix, 'releases', releaseB);
      expect(info.release).toEqual({ id: releaseB, dir: dirB });
      expect(cmdline(info.pid)).toContain(path.join(dirB, 'bin', 'containerd-shim-kata-ts-v2'));
      const one = await shimInfo(pods[0]!.podId);
      expect(one.release?.id).toBe(releaseA);
      expect(cmdline(one.pid).join(' ')).not.toContain(releaseB);
      expect(await exec(pod.appId, 'two on B')).toEqual(['two on B\n', 0]);
      expect(await exec(pods[0]!.appId, 'one on A')).toEqual(['one on A\n', 0]);

      const list = await kataTs('release', 'list', ...releaseArgs());
      expect(list).toContain(`  ${releaseA}  `);
      expect(list).toContain(`* ${releaseB}  `);
      expect(list).toContain(`pod ${pods[0]!.podId} (k8s.io), shim pid ${one.pid}`);
      expect(list).toContain(`pod ${pod.podId} (k8s.io), shim pid ${info.pid}`);

      const prune = await kataTs('release', 'prune', ...releaseArgs());
      // The pod's shim and its port-forward helper (dist/native/kata-ts-portfwd, in the pod's netns)
      // both run from release A: both pin it.
      expect(prune).toContain(`keeping ${releaseA}: in use by 2 process(es): pod ${pods[0]!.podId} (k8s.io), shim pid ${one.pid}; pid `);
      expect(prune).toMatch(new RegExp(`keeping ${releaseA.replaceAll('.', '\\.')}: .*; pid \\d+ \\(kata-ts-portfwd\\)\n`));
      expect(prune).toContain(`keeping ${releaseB}: it is current`);
      expect((await fsp.readdir(path.join(prefix, 'releases'))).sort()).toEqual([releaseA, releaseB].sort());
      const remove = await execFileAsync(path.join(binDir, 'kata-ts'), ['release', 'remove', releaseA, ...releaseArgs()]).catch(
        (err: { code?: number; stderr?: string }) => err,
      );
      expect(remove).toMatchObject({ code: 1 });
      expect((remove as { stderr?: string }).stderr).toContain(`RELEASE_IN_USE: release ${releaseA} is in use by 2 process(es)`);
    },
    BOOT,
  );

  it(
    'pod 1 stops and goes through containerd; prune then removes A; pod 2 keeps running on B',
    async () => {
      await removePod(pods[0]!);
      const prune = await kataTs('release', 'prune', ...releaseArgs());
      expect(prune).toContain(`removed ${releaseA}`);
      expect(await fsp.readdir(path.join(prefix, 'releases'))).toEqual([releaseB]);
      expect(await exec(pods[1]!.appId, 'two after the prune')).toEqual(['two after the prune\n', 0]);
      await removePod(pods[1]!);
      expect(liveProcessesMentioning(prefix)).toEqual([]);
      expect(liveProcessesMentioning(stateRoot)).toEqual([]);
    },
    BOOT,
  );
});
