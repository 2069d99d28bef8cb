/**
 * kata-ts behind the containerd releases nodes run now, beside runc: trixie's 1.7 and sid's 2.x,
 * fetched by package name with apt's own client into the repository's cache
 * (test/helpers/containerd-releases.ts; Debian 12's 1.6 has containerd-kata.test.ts and
 * install.test.ts). For each release, one private containerd (test/helpers/containerd.ts, the
 * config schema that release reads) started with no kata-ts handler:
 *
 * 1. `kata-ts install --containerd` (the CLI from source, the release's own `containerd
 *    --version`) writes the handlers: appended to the version 2 config on 1.7, a version 3 drop-in
 *    in the `conf.d` the config imports on 2.x; containerd restarted loads it and its CRI lists
 *    both handlers (Status verbose's config; 2.x also in Status' runtime handlers);
 * 2. a runc pod with a container (the release's own containerd-shim-runc-v2) and, through the
 *    installed handler, a kata-ts pod (one VM boot) with a container: its output in the CRI log,
 *    ExecSync, its address in the pod network, StopContainer's exit code, RemoveContainer;
 * 3. both pods stopped and removed: the shim exits, no process, mount, cgroup or state file of
 *    the pod is left (and stop() of the harness finds nothing in the private tree);
 * 4. `kata-ts uninstall --containerd` restores the config (and the conf.d) byte for byte;
 *    containerd restarted knows no kata-ts handler.
 *
 * And, without a VM: install and uninstall against 2.x reading a version 2 config, the layout
 * Debian's 2.x package ships (containerd migrates it; `sandbox_mode` becomes `sandboxer`).
 *
 * And the Sandbox API on 2.x (`sandboxer = "shim"`, one VM): the pod's own resources size the VM
 * (an over-sized pod refused naming its vCPUs), a container logs and execs, the service's Status,
 * Platform, Ping and Metrics answer on the pod's socket, stop and remove leave nothing.
 *
 * Skipped with a notice naming why when a release cannot be fetched (no route to Debian's
 * archive) or does not run here.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { renderTables } from '../../../src/install/handlers.js';
import { formatVersion } from '../../../src/install/version.js';
import { decodeMessage, encodeMessage, type MessageInput, type MessageName } from '../../../src/shim/proto.js';
import { connectTtrpc } from '../../../src/ttrpc/index.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER, mountPointsUnder } from '../../helpers/containerd.js';
import { type ContainerdReleaseLabel, containerdRelease } from '../../helpers/containerd-releases.js';
import { until, untilLogLines } from '../../helpers/poll.js';
import { isRunning, liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);

/** `kata-ts <args>` from the sources, as an operator runs it; its exit code and output. */
async function kataTs(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return execFileAsync(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', ...args], { cwd: packageRoot() }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

/**
 * What an install may touch beside the config, relative to its directory, with their bytes
 * (base64): `config.toml` and every `config.toml*` beside it (backup, install record), and the
 * whole `conf.d` tree (the 2.x drop-in); `conf.d` itself as `dir` when it exists.
 */
async function configFiles(configPath: string): Promise<Record<string, string>> {
  const dir = path.dirname(configPath);
  const out: Record<string, string> = {};
  for (const name of await fsp.readdir(dir)) {
    if (name.startsWith(path.basename(configPath))) out[name] = (await fsp.readFile(path.join(dir, name))).toString('base64');
  }
  const confD = path.join(dir, 'conf.d');
  if (existsSync(confD)) {
    out['conf.d'] = 'dir';
    for (const entry of await fsp.readdir(confD, { withFileTypes: true, recursive: true })) {
      const full = path.join(entry.parentPath, entry.name);
      out[path.relative(dir, full)] = entry.isFile() ? (await fsp.readFile(full)).toString('base64') : 'not a file';
    }
  }
  return out;
}

const LABELS: ContainerdReleaseLabel[] = ['1.7', '2.1'];
const RELEASES = await Promise.all(LABELS.map((label) => containerdRelease(label)));

for (const [i, label] of LABELS.entries()) {
  const resolved = RELEASES[i]!;
  const release = resolved.release;
  const missing = resolved.missing ?? containerdMissing(release ?? undefined);
  if (missing !== null) console.warn(`kata-ts behind containerd ${label} skipped: ${missing}`);
  const version = release === null ? label : formatVersion(release.version);
  const v2 = release !== null && release.version.major >= 2;

  describe.skipIf(missing !== null)(`kata-ts behind containerd ${version} (${release?.source}), beside runc`, () => {
    const node = new ShimNode(`/tmp/ktv${label.replace('.', '')}-`);
    let image = '';
    let original: Record<string, string> = {};
    let configDir = '';
    let kataPod = '';
    let runcPod = '';
    let kataApp = '';
    let runcApp = '';
    const kataUid = randomUUID();
    const runcUid = randomUUID();
    const parentOf = (uid: string) => `/kubepods/burstable/pod${uid}`;
    const logDirs: Record<string, string> = {};
    const sandboxConfig = (name: string, uid: string): PodSandboxConfig => ({
      metadata: { name, uid, namespace: 'default', attempt: 0 },
      hostname: `${name}-pod`,
      log_directory: logDirs[uid] ?? '',
      linux: { cgroup_parent: parentOf(uid) },
    });
    const containerStatus = async (id: string) => (await node.cri.runtime.ContainerStatus({ container_id: id })).status!;
    /** The runtimes containerd's CRI plugin runs with: Status verbose's `config` (what `crictl info` prints). */
    const criRuntimes = async (): Promise<Record<string, Record<string, unknown>>> => {
      const res = await node.cri.runtime.Status({ verbose: true });
      const config = JSON.parse(res.info.config ?? '{}') as { containerd?: { runtimes?: Record<string, Record<string, unknown>> } };
      return config.containerd?.runtimes ?? {};
    };
    const installArgs = () => ['--containerd', '--config', node.ctrd.configPath, '--containerd-binary', release!.containerd];
    const kataPodDir = () => path.join(node.stateRoot, 'k8s.io', kataPod.slice(0, 16));

    beforeAll(async () => {
      await node.start({
        // A TCG boot on a machine shared with other runs can take minutes: wait on the boot, not a clock sized for an idle machine.
        shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(480_000) } },
        containerd: {
          ...(release === null ? {} : { release }),
          kataHandler: false,
          // 2.x nodes commonly import a conf.d: kata-ts install writes its drop-in there.
          ...(v2 ? { imports: ['conf.d/*.toml'] } : {}),
        },
      });
      configDir = path.dirname(node.ctrd.configPath);
      original = await configFiles(node.ctrd.configPath);
      image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', `v${label}`, ['sleep', 'ip', 'hostname', 'cat']);
      await node.cri.image.PullImage({ image: { image } });
      for (const uid of [kataUid, runcUid]) logDirs[uid] = await node.podLogDir(uid === kataUid ? 'kata' : 'plain', uid);
    });

    afterAll(() => node.stop());

    it(`the release running is ${label}, and before the install it knows no kata-ts handler`, async () => {
      const v = await node.cri.runtime.Version({});
      expect(v.runtime_version.startsWith(`${formatVersion(release!.version)}`)).toBe(true);
      expect(Object.keys(await criRuntimes())).toEqual(['runc']);
      await expect(
        node.cri.runtime.RunPodSandbox({ config: sandboxConfig('early', randomUUID()), runtime_handler: KATA_TS_HANDLER }),
      ).rejects.toThrow(/no runtime for "kata-ts" is configured/);
    });

    it(`kata-ts install --containerd writes ${v2 ? 'a version 3 drop-in' : 'version 2 tables'}; containerd restarted lists both handlers`, async () => {
      const config = node.ctrd.configPath;
      const done = await kataTs(['install', ...installArgs()]);
      expect(done.code, done.stderr).toBe(0);
      expect(done.stdout).toContain(`kata-ts install: containerd ${formatVersion(release!.version)}`);
      if (v2) {
        const dropIn = path.join(configDir, 'conf.d', 'kata-ts.toml');
        expect(done.stdout).toContain(`wrote drop-in ${dropIn}`);
        expect(await fsp.readFile(config, 'utf8')).toBe(Buffer.from(original['config.toml']!, 'base64').toString('utf8'));
        const text = await fsp.readFile(dropIn, 'utf8');
        expect(text).toContain('version = 3');
        expect(text).toContain(`[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata-ts]`);
      } else {
        expect(done.stdout).toContain(`appended to ${config} (version 2`);
      }
      await node.restartContainerd();
      const runtimes = await criRuntimes();
      expect(Object.keys(runtimes).sort()).toEqual(['kata-ts', 'kata-ts-cvm', 'runc']);
      expect(runtimes['kata-ts']).toMatchObject({
        runtimeType: 'io.containerd.kata-ts.v2',
        PodAnnotations: ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*', 'cdi.k8s.io/*'],
        privileged_without_host_devices: true,
      });
      expect(runtimes['kata-ts-cvm']).toMatchObject({ runtimeType: 'io.containerd.kata-ts-cvm.v2' });
      // 1.7 names the sandbox implementation sandbox_mode, 2.x sandboxer: both the pause container's.
      expect(runtimes['kata-ts']?.[v2 ? 'sandboxer' : 'sandboxMode']).toBe('podsandbox');
      if (v2) {
        // 2.x also announces its handlers (KEP-3857) in Status, and answers RuntimeConfig (KEP-4033)
        // with the driver of its runc runtime (SystemdCgroup = false).
        const status = await node.cri.runtime.Status({});
        expect(status.runtime_handlers.map((h) => h.name).sort()).toEqual(expect.arrayContaining(['kata-ts', 'kata-ts-cvm']));
        expect((await node.cri.runtime.RuntimeConfig({})).linux?.cgroup_driver).toBe('CGROUPFS');
      } else {
        // Measured: 1.7.24 has no RuntimeConfig yet (the kubelet falls back to its own setting).
        await expect(node.cri.runtime.RuntimeConfig({})).rejects.toThrow(/UNIMPLEMENTED/);
      }
    });

    it("a runc pod with a container, on the release's own runc shim", async () => {
      runcPod = (await node.cri.runtime.RunPodSandbox({ config: sandboxConfig('plain', runcUid), runtime_handler: '' })).pod_sandbox_id;
      runcApp = (
        await node.cri.runtime.CreateContainer({
          pod_sandbox_id: runcPod,
          config: {
            metadata: { name: 'app', attempt: 0 },
            image: { image },
            command: ['sh', '-c', 'echo hello from runc; exec sleep 3600'],
            log_path: 'app.log',
          },
          sandbox_config: sandboxConfig('plain', runcUid),
        })
      ).container_id;
      await node.cri.runtime.StartContainer({ container_id: runcApp });
      await untilLogLines('the runc container output', [path.join(logDirs[runcUid]!, 'app.log')], (l) =>
        l.includes('stdout F hello from runc'),
      );
      // The runc shim that serves it is the release's own binary.
      const shims = liveProcessesMentioning(`-id\u0000${runcPod}`);
      expect(shims.length).toBeGreaterThan(0);
      expect(shims.map((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[0])).toContain(
        release!.binDir === null ? 'containerd-shim-runc-v2' : path.join(release!.binDir, 'containerd-shim-runc-v2'),
      );
    });

    it('RunPodSandbox with the installed kata-ts handler boots the pod VM in the pod network containerd made (one VM)', {
      timeout: scaledMs(900_000),
    }, async () => {
      kataPod = (
        await node.cri.runtime.RunPodSandbox(
          { config: sandboxConfig('kata', kataUid), runtime_handler: KATA_TS_HANDLER },
          { deadline: Date.now() + scaledMs(600_000) },
        )
      ).pod_sandbox_id;
      const { status } = await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: kataPod });
      expect(status?.state).toBe('SANDBOX_READY');
      expect(status?.network?.ip.startsWith(node.ctrd.podSubnetPrefix)).toBe(true);
      const qemu = liveProcessesMentioning(kataPodDir()).filter((p) =>
        readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'),
      );
      expect(qemu).toHaveLength(1);
      expect(readFileSync(`/proc/${qemu[0]}/cgroup`, 'utf8')).toContain(`/pod${kataUid}/`);
      // How containerd finds the shim again: 1.x reads `<bundle>/address`, 2.x `<bundle>/bootstrap.json`
      // (its shim manager connects through it); both name the pod shim's socket under our state root.
      const bundle = node.ctrd.bundleDir(kataPod);
      const address = v2
        ? (JSON.parse(await fsp.readFile(path.join(bundle, 'bootstrap.json'), 'utf8')) as { address: string; protocol: string })
        : { address: await fsp.readFile(path.join(bundle, 'address'), 'utf8'), protocol: 'ttrpc' };
      expect(address.protocol).toBe('ttrpc');
      expect(address.address.startsWith(`unix://${path.join(node.stateRoot, 's')}/`)).toBe(true);
    });

    it('a kata-ts container: its output in the CRI log, ExecSync, its address in the pod network', async () => {
      kataApp = (
        await node.cri.runtime.CreateContainer({
          pod_sandbox_id: kataPod,
          config: {
            metadata: { name: 'app', attempt: 0 },
            image: { image },
            command: [
              'sh',
              '-c',
              "trap 'echo got TERM; exit 42' TERM; echo hello from the VM; echo to stderr >&2; while :; do sleep 1 & wait $!; done",
            ],
            log_path: 'app.log',
          },
          sandbox_config: sandboxConfig('kata', kataUid),
        })
      ).container_id;
      await node.cri.runtime.StartContainer({ container_id: kataApp });
      expect((await containerStatus(kataApp)).state).toBe('CONTAINER_RUNNING');
      await untilLogLines(
        'the container output in the CRI log',
        [path.join(logDirs[kataUid]!, 'app.log')],
        (l) => l.includes('stdout F hello from the VM') && l.includes('stderr F to stderr'),
      );
      const res = await node.cri.runtime.ExecSync({
        container_id: kataApp,
        cmd: ['sh', '-c', 'echo out; echo err >&2; exit 3'],
        timeout: 60,
      });
      expect([res.stdout.toString(), res.stderr.toString(), res.exit_code]).toEqual(['out\n', 'err\n', 3]);
      const podIp = (await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: kataPod })).status?.network?.ip ?? '';
      const ip = await node.cri.runtime.ExecSync({ container_id: kataApp, cmd: ['ip', '-4', '-o', 'addr'], timeout: 60 });
      expect(ip.stdout.toString()).toContain(`inet ${podIp}/`);
      const hostname = await node.cri.runtime.ExecSync({ container_id: kataApp, cmd: ['hostname'], timeout: 60 });
      expect(hostname.stdout.toString().trim()).toBe('kata-pod');
      // The kernel the container runs on is the guest's, not the host's.
      const uname = await node.cri.runtime.ExecSync({ container_id: kataApp, cmd: ['cat', '/proc/sys/kernel/osrelease'], timeout: 60 });
      expect(uname.stdout.toString().trim()).not.toBe(readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim());
    });

    it('StopContainer: SIGTERM and its exit code; RemoveContainer (both pods)', async () => {
      await node.cri.runtime.StopContainer({ container_id: kataApp, timeout: 30 });
      expect(await containerStatus(kataApp)).toMatchObject({ state: 'CONTAINER_EXITED', exit_code: 42 });
      await untilLogLines('the trap output', [path.join(logDirs[kataUid]!, 'app.log')], (l) => l.includes('stdout F got TERM'));
      await node.cri.runtime.RemoveContainer({ container_id: kataApp });
      await node.cri.runtime.StopContainer({ container_id: runcApp, timeout: 5 });
      await node.cri.runtime.RemoveContainer({ container_id: runcApp });
      const { containers } = await node.cri.runtime.ListContainers({});
      expect(containers.map((c) => c.id)).not.toContain(kataApp);
      expect(containers.map((c) => c.id)).not.toContain(runcApp);
    });

    it('StopPodSandbox, RemovePodSandbox: the shim exits, leaving no process, mount, cgroup or file of the pod', async () => {
      const podDir = kataPodDir();
      const shims = liveProcessesMentioning(`-id\u0000${kataPod}`).filter((p) =>
        readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('serve'),
      );
      expect(shims).toHaveLength(1);
      for (const id of [kataPod, runcPod]) {
        await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
        await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
      }
      expect((await node.cri.runtime.ListPodSandbox({})).items).toEqual([]);
      await until('the shim to exit', async (note) => {
        note(isRunning(shims[0]!));
        return isRunning(shims[0]!) ? undefined : true;
      });
      await until('no process of the pod', async (note) => {
        const left = liveProcessesMentioning(podDir);
        note(left);
        return left.length === 0 ? true : undefined;
      });
      expect(existsSync(podDir)).toBe(false);
      expect(await fsp.readdir(path.join(node.stateRoot, 's'))).toEqual([]);
      expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
      const runtimeMounts = await node.ctrd.nodeExec([
        'nsenter',
        `--mount=${node.mountNamespacePath}`,
        '--',
        'cat',
        '/proc/self/mountinfo',
      ]);
      expect(mountPointsUnder(runtimeMounts, podDir)).toEqual([]);
      // No process of either pod is left in the private tree (containerd only), and no cgroup below the pods' parents.
      await until('nothing left in the private cgroup tree', async (note) => {
        const strays = await node.ctrd.strayProcesses();
        note(strays);
        return strays.length === 0 ? true : undefined;
      });
      for (const uid of [kataUid, runcUid]) {
        for (const d of node.ctrd.cgroupDirs(parentOf(uid))) {
          const children = (await fsp.readdir(d, { withFileTypes: true }).catch(() => []))
            .filter((e) => e.isDirectory())
            .map((e) => e.name);
          expect(children, d).toEqual([]);
        }
      }
    });

    it('kata-ts uninstall --containerd: the config (and its conf.d) byte for byte as before; containerd restarted knows no kata-ts handler', async () => {
      const done = await kataTs(['uninstall', ...installArgs()]);
      expect(done.code, done.stderr).toBe(0);
      expect(await configFiles(node.ctrd.configPath)).toEqual(original);
      const again = await kataTs(['uninstall', ...installArgs()]);
      expect(again.stdout).toContain('nothing changed');
      await node.restartContainerd();
      expect(Object.keys(await criRuntimes())).toEqual(['runc']);
      await expect(
        node.cri.runtime.RunPodSandbox({ config: sandboxConfig('late', randomUUID()), runtime_handler: KATA_TS_HANDLER }),
      ).rejects.toThrow(/no runtime for "kata-ts" is configured/);
    });
  });
}

// Debian's own containerd 2.x package ships a version 2 /etc/containerd/config.toml (measured in
// sid's 2.1.9 .deb), which 2.x migrates when it loads it: the installer must append version 2
// tables there, and containerd must read them as its runtimes. No VM is booted here.
{
  const resolved = RELEASES[LABELS.indexOf('2.1')]!;
  const release = resolved.release;
  const missing = resolved.missing ?? containerdMissing(release ?? undefined);
  describe.skipIf(missing !== null)(
    `kata-ts install --containerd against containerd ${release === null ? '2.1' : formatVersion(release.version)} reading a version 2 config (as Debian's package ships)`,
    () => {
      const node = new ShimNode('/tmp/ktv21v2-');
      let original: Record<string, string> = {};
      const installArgs = () => ['--containerd', '--config', node.ctrd.configPath, '--containerd-binary', release!.containerd];
      const criRuntimes = async (): Promise<Record<string, Record<string, unknown>>> => {
        const res = await node.cri.runtime.Status({ verbose: true });
        const config = JSON.parse(res.info.config ?? '{}') as { containerd?: { runtimes?: Record<string, Record<string, unknown>> } };
        return config.containerd?.runtimes ?? {};
      };

      beforeAll(async () => {
        await node.start({ containerd: { ...(release === null ? {} : { release }), kataHandler: false, configSchema: 2 } });
        original = await configFiles(node.ctrd.configPath);
      });

      afterAll(() => node.stop());

      it('install appends version 2 tables; containerd migrates them: both handlers, on the pause-container sandboxer', async () => {
        expect((await fsp.readFile(node.ctrd.configPath, 'utf8')).startsWith('version = 2\n')).toBe(true);
        expect(node.ctrd.logText()).toContain('Configuration migrated from version 2');
        const done = await kataTs(['install', ...installArgs()]);
        expect(done.code, done.stderr).toBe(0);
        expect(done.stdout).toContain(`appended to ${node.ctrd.configPath} (version 2`);
        const text = await fsp.readFile(node.ctrd.configPath, 'utf8');
        expect(text).toContain('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts]');
        expect(text).toContain('sandbox_mode = "podsandbox"');
        await node.restartContainerd();
        const runtimes = await criRuntimes();
        expect(Object.keys(runtimes).sort()).toEqual(['kata-ts', 'kata-ts-cvm', 'runc']);
        // 1.x's sandbox_mode arrives as 2.x's sandboxer.
        expect(runtimes['kata-ts']).toMatchObject({ runtimeType: 'io.containerd.kata-ts.v2', sandboxer: 'podsandbox' });
        expect(runtimes['kata-ts-cvm']).toMatchObject({ runtimeType: 'io.containerd.kata-ts-cvm.v2', sandboxer: 'podsandbox' });
      });

      it('uninstall: the config byte for byte; containerd restarted knows no kata-ts handler', async () => {
        const done = await kataTs(['uninstall', ...installArgs()]);
        expect(done.code, done.stderr).toBe(0);
        expect(await configFiles(node.ctrd.configPath)).toEqual(original);
        await node.restartContainerd();
        expect(Object.keys(await criRuntimes())).toEqual(['runc']);
      });
    },
  );
}

// containerd 2.x's Sandbox API: a runtime with `sandboxer = "shim"` (the tables `kata-ts install
// --sandboxer shim` writes) gets no pause container; the
// shim receives the whole PodSandboxConfig at CreateSandbox and boots the VM at StartSandbox,
// sized from the pod's own linux.resources (one VM boot).
{
  const resolved = RELEASES[LABELS.indexOf('2.1')]!;
  const release = resolved.release;
  const missing = resolved.missing ?? containerdMissing(release ?? undefined);
  describe.skipIf(missing !== null)(
    `kata-ts behind containerd ${release === null ? '2.1' : formatVersion(release.version)} with sandboxer = "shim" (the Sandbox API)`,
    () => {
      const node = new ShimNode('/tmp/ktv21sb-');
      let image = '';
      let logDir = '';
      const uid = randomUUID();
      const MiB = 1024 * 1024;
      const podConfig = (cpuQuota: number): PodSandboxConfig => ({
        metadata: { name: 'sbx', uid, namespace: 'default', attempt: 0 },
        hostname: 'sbx-pod',
        log_directory: logDir,
        linux: {
          cgroup_parent: `/kubepods/burstable/pod${uid}`,
          resources: { cpu_period: '100000', cpu_quota: String(cpuQuota), memory_limit_in_bytes: String(768 * MiB) },
        },
      });

      beforeAll(async () => {
        await node.start({
          shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(480_000) } },
          containerd: {
            ...(release === null ? {} : { release }),
            kataHandler: false,
            // The tables `kata-ts install --sandboxer shim` writes for a version 3 config.
            extraToml: renderTables(release?.version ?? { major: 2, minor: 1, patch: 0 }, 3, 'shim'),
          },
        });
        image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'sbx', ['sleep', 'cat', 'hostname']);
        await node.cri.image.PullImage({ image: { image } });
        logDir = await node.podLogDir('sbx', uid);
      });

      afterAll(() => node.stop());

      it("the pod's own resources reach the VM planner: a pod needing more vCPUs than the host has is refused, naming them, before any VM", async () => {
        const err = await node.cri.runtime.RunPodSandbox({ config: podConfig(200_000), runtime_handler: KATA_TS_HANDLER }).then(
          () => undefined,
          (e: { code?: number; details?: string }) => e,
        );
        expect(err?.code).toBe(8); // RESOURCE_EXHAUSTED
        expect(err?.details).toMatch(/needs \d+ vCPUs \(2000m workload/);
        expect(liveProcessesMentioning(node.stateRoot)).toEqual([]);
      });

      let podId = '';
      it('RunPodSandbox: CreateSandbox and StartSandbox boot the VM sized from the pod config, no pause container; a container logs and execs', {
        timeout: scaledMs(900_000),
      }, async () => {
        podId = (
          await node.cri.runtime.RunPodSandbox(
            { config: podConfig(100_000), runtime_handler: KATA_TS_HANDLER },
            { deadline: Date.now() + scaledMs(600_000) },
          )
        ).pod_sandbox_id;
        expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_READY');
        // No task bundle for the pod (no pause container): its bundle is the sandboxer's.
        expect(existsSync(node.ctrd.bundleDir(podId))).toBe(false);
        expect(existsSync(path.join(node.ctrd.stateDir, 'io.containerd.sandbox.controller.v1.shim', 'k8s.io', podId))).toBe(true);
        const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
        const [qemu] = liveProcessesMentioning(podDir).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
        const argv = readFileSync(`/proc/${qemu}/cmdline`, 'utf8').split('\0');
        const memory = /size=(\d+)M/.exec(argv[argv.indexOf('-m') + 1] ?? '')?.[1];
        expect(Number(memory)).toBeGreaterThanOrEqual(768);
        expect(readFileSync(`/proc/${qemu}/cgroup`, 'utf8')).toContain(`/pod${uid}/`);

        const app = (
          await node.cri.runtime.CreateContainer({
            pod_sandbox_id: podId,
            config: {
              metadata: { name: 'app', attempt: 0 },
              image: { image },
              command: ['sh', '-c', 'echo hello through the sandbox api; exec sleep 3600'],
              log_path: 'app.log',
            },
            sandbox_config: podConfig(100_000),
          })
        ).container_id;
        await node.cri.runtime.StartContainer({ container_id: app });
        await untilLogLines('the container output', [path.join(logDir, 'app.log')], (l) =>
          l.includes('stdout F hello through the sandbox api'),
        );
        const res = await node.cri.runtime.ExecSync({
          container_id: app,
          cmd: ['sh', '-c', 'hostname; cat /proc/sys/kernel/osrelease'],
          timeout: 60,
        });
        const [hostname, kernel] = res.stdout.toString().trim().split('\n');
        expect(hostname).toBe('sbx-pod');
        expect(kernel).not.toBe(readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim());

        // The Sandbox API's other calls, on the pod's shim socket containerd's bootstrap.json names.
        const bootstrapFile = path.join(node.ctrd.stateDir, 'io.containerd.sandbox.controller.v1.shim', 'k8s.io', podId, 'bootstrap.json');
        const bootstrap = JSON.parse(await fsp.readFile(bootstrapFile, 'utf8')) as { address: string };
        const client = await connectTtrpc(bootstrap.address.replace(/^unix:\/\//, ''), { timeoutMs: 10_000 });
        const call = async <Req extends MessageName, Res extends MessageName>(
          method: string,
          req: Req,
          res: Res,
          body: MessageInput<Req>,
        ) => decodeMessage(res, await client.call('containerd.runtime.sandbox.v1.Sandbox', method, encodeMessage(req, body)));
        const sbx = 'containerd.runtime.sandbox.v1';
        try {
          const status = await call('SandboxStatus', `${sbx}.SandboxStatusRequest`, `${sbx}.SandboxStatusResponse`, { sandbox_id: podId });
          expect(status).toMatchObject({ sandbox_id: podId, pid: Number(qemu), state: 'SANDBOX_READY' });
          const platform = await call('Platform', `${sbx}.PlatformRequest`, `${sbx}.PlatformResponse`, { sandbox_id: podId });
          expect(platform.platform).toMatchObject({ os: 'linux', architecture: 'amd64' });
          await call('PingSandbox', `${sbx}.PingRequest`, `${sbx}.PingResponse`, { sandbox_id: podId });
          const metrics = await call('SandboxMetrics', `${sbx}.SandboxMetricsRequest`, `${sbx}.SandboxMetricsResponse`, {
            sandbox_id: podId,
          });
          expect(metrics.metrics?.id).toBe(podId);
          expect(metrics.metrics?.data?.type_url).toMatch(/^io\.containerd\.cgroups\.v[12]\.Metrics$/);
          // Another sandbox's id is refused, naming it.
          await expect(call('PingSandbox', `${sbx}.PingRequest`, `${sbx}.PingResponse`, { sandbox_id: 'other' })).rejects.toThrow(
            /sandbox_id other is not this shim's sandbox/,
          );
        } finally {
          await client.close();
        }

        await node.cri.runtime.StopContainer({ container_id: app, timeout: 5 });
        await node.cri.runtime.RemoveContainer({ container_id: app });
      });

      it('a containerd restart: the new containerd finds the sandbox ready through the shim and runs a container in it', async () => {
        await node.restartContainerd();
        expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_READY');
        const again = (
          await node.cri.runtime.CreateContainer({
            pod_sandbox_id: podId,
            config: { metadata: { name: 'again', attempt: 0 }, image: { image }, command: ['sleep', '3600'], log_path: 'again.log' },
            sandbox_config: podConfig(100_000),
          })
        ).container_id;
        await node.cri.runtime.StartContainer({ container_id: again });
        const res = await node.cri.runtime.ExecSync({ container_id: again, cmd: ['hostname'], timeout: 60 });
        expect(res.stdout.toString().trim()).toBe('sbx-pod');
        await node.cri.runtime.StopContainer({ container_id: again, timeout: 5 });
        await node.cri.runtime.RemoveContainer({ container_id: again });
      });

      it('StopPodSandbox, RemovePodSandbox (StopSandbox, ShutdownSandbox): the shim ends, nothing of the pod is left', async () => {
        const podDir = path.join(node.stateRoot, 'k8s.io', podId.slice(0, 16));
        await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId });
        expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId })).status?.state).toBe('SANDBOX_NOTREADY');
        expect(liveProcessesMentioning(podDir).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'))).toEqual(
          [],
        );
        await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId });
        await until('no process of the pod and no state', async (note) => {
          const left = liveProcessesMentioning(node.stateRoot);
          note({ left, dir: existsSync(podDir) });
          return left.length === 0 && !existsSync(podDir) ? true : undefined;
        });
        expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
        await until('nothing left in the private cgroup tree', async (note) => {
          const strays = await node.ctrd.strayProcesses();
          note(strays);
          return strays.length === 0 ? true : undefined;
        });
      });

      it('the shim SIGKILLed: StopPodSandbox and RemovePodSandbox, retried as the kubelet does, end with no VM, state or mount left', {
        timeout: scaledMs(900_000),
      }, async () => {
        const id = (
          await node.cri.runtime.RunPodSandbox(
            {
              config: { ...podConfig(100_000), metadata: { name: 'doomed', uid: randomUUID(), namespace: 'default', attempt: 0 } },
              runtime_handler: KATA_TS_HANDLER,
            },
            { deadline: Date.now() + scaledMs(600_000) },
          )
        ).pod_sandbox_id;
        const podDir = path.join(node.stateRoot, 'k8s.io', id.slice(0, 16));
        const [shim] = liveProcessesMentioning(`-id\u0000${id}`).filter((p) =>
          readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('serve'),
        );
        expect(liveProcessesMentioning(podDir).some((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'))).toBe(
          true,
        );
        process.kill(shim!, 'SIGKILL');
        // Until containerd 2.1.9 has noticed the death it still calls the dead shim and fails
        // ("ttrpc: closed"), StopSandbox and then ShutdownSandbox; its dead-shim cleanup runs our
        // `delete`, which ends the VM and, once the removal is asked, the pod's state. The kubelet
        // retries both calls; so does this test.
        await until('StopPodSandbox to succeed', async (note) =>
          node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id }).then(
            () => true,
            (err: Error) => {
              note(err.message);
              return undefined;
            },
          ),
        );
        await until('RemovePodSandbox to succeed', async (note) =>
          node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).then(
            () => true,
            (err: Error) => {
              note(err.message);
              return undefined;
            },
          ),
        );
        await until('no process of the pod and no state', async (note) => {
          const left = liveProcessesMentioning(podDir);
          note({ left, dir: existsSync(podDir) });
          return left.length === 0 && !existsSync(podDir) ? true : undefined;
        });
        expect((await node.cri.runtime.ListPodSandbox({})).items).toEqual([]);
        expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
      });
    },
  );
}
