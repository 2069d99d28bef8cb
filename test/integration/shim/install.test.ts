/**
 * `kata-ts install --containerd` / `uninstall --containerd` against the real containerd (Debian's
 * 1.6.20, started privately by test/helpers/containerd.ts with a config.toml that names no kata-ts
 * handler): the CLI (from source) edits that private config, containerd restarted lists both
 * handlers in its CRI status (what `crictl info` shows; `$CRICTL info` too when CRICTL is set), a
 * kata-ts pod boots (one VM) and is removed, then uninstall leaves the config byte for byte as it
 * was and containerd restarted no longer knows the handlers. Nothing touches /etc/containerd.
 *
 * Skipped with a notice when containerd (or runc, the CNI plugins) is not installed.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { criToolPath } from '../../helpers/cri-tools.js';
import { until } from '../../helpers/poll.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const MISSING = containerdMissing();
if (MISSING !== null) console.warn(`kata-ts install against containerd skipped: ${MISSING}`);

/** `kata-ts <args>` from the sources, as an operator runs it; its exit code and output. */
async function kataTs(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return execFileAsync(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', ...args], { cwd: packageRoot() }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

describe.skipIf(MISSING !== null)('kata-ts install --containerd against containerd 1.6.20', () => {
  const node = new ShimNode('/tmp/kti-');
  let original = '';

  /** The runtimes containerd's CRI plugin runs with: Status verbose's `config` (what `crictl info` prints). */
  const criRuntimes = async (): Promise<Record<string, { runtimeType: string; PodAnnotations?: string[] }>> => {
    const res = await node.cri.runtime.Status({ verbose: true });
    const config = JSON.parse(res.info.config ?? '{}') as { containerd?: { runtimes?: Record<string, { runtimeType: string }> } };
    return config.containerd?.runtimes ?? {};
  };
  const restart = () => node.restartContainerd();
  const sandboxConfig = (name: string): PodSandboxConfig => ({
    metadata: { name, uid: randomUUID(), namespace: 'default', attempt: 0 },
    hostname: name,
    log_directory: path.join(node.ctrd.dir, 'pods', name),
    linux: { cgroup_parent: `/kubepods/besteffort/pod${randomUUID()}` },
  });

  beforeAll(async () => {
    await node.start({
      // A TCG boot on a machine shared with other runs can take minutes: wait on the boot, not a clock sized for an idle machine.
      shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(480_000) } },
      containerd: { kataHandler: false },
    });
    original = await fsp.readFile(node.ctrd.configPath, 'utf8');
  });

  afterAll(() => node.stop());

  it('before: containerd knows no kata-ts handler and refuses a pod for it', async () => {
    expect(Object.keys(await criRuntimes())).toEqual(['runc']);
    await expect(node.cri.runtime.RunPodSandbox({ config: sandboxConfig('early'), runtime_handler: KATA_TS_HANDLER })).rejects.toThrow(
      /no runtime for "kata-ts" is configured/,
    );
  });

  it('install (dry run, then for real) edits the private config; containerd restarted lists both handlers', async () => {
    const config = node.ctrd.configPath;
    const dry = await kataTs(['install', '--containerd', '--config', config, '--dry-run']);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toContain('kata-ts install: containerd 1.6.20'); // from `containerd --version`
    expect(dry.stdout).toContain(`would have appended to ${config}`);
    expect(await fsp.readFile(config, 'utf8')).toBe(original);

    const done = await kataTs(['install', '--containerd', '--config', config]);
    expect(done.code, done.stderr).toBe(0);
    expect(done.stdout).toContain(`kata-ts install: backed up ${config} to ${config}.kata-ts-backup`);
    expect(done.stdout).toContain(`kata-ts install: recorded the install in ${config}.kata-ts-install.json`);
    expect((await fsp.readFile(config, 'utf8')).startsWith(original)).toBe(true);
    const again = await kataTs(['install', '--containerd', '--config', config]);
    expect(again.stdout).toContain('nothing changed');

    await restart();
    const runtimes = await criRuntimes();
    expect(Object.keys(runtimes)).toEqual(['kata-ts', 'kata-ts-cvm', 'runc']);
    expect(runtimes['kata-ts']).toMatchObject({
      runtimeType: 'io.containerd.kata-ts.v2',
      PodAnnotations: ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*', 'cdi.k8s.io/*'],
    });
    expect(runtimes['kata-ts-cvm']).toMatchObject({ runtimeType: 'io.containerd.kata-ts-cvm.v2' });

    const crictl = process.env.CRICTL === undefined ? null : criToolPath('crictl');
    if (crictl !== null) {
      const { stdout } = await execFileAsync(crictl, ['--runtime-endpoint', `unix://${node.ctrd.criSocket}`, 'info']);
      const info = JSON.parse(stdout) as { config: { containerd: { runtimes: Record<string, { runtimeType: string }> } } };
      expect(info.config.containerd.runtimes['kata-ts']?.runtimeType).toBe('io.containerd.kata-ts.v2');
      expect(info.config.containerd.runtimes['kata-ts-cvm']?.runtimeType).toBe('io.containerd.kata-ts-cvm.v2');
    }
  });

  it('a kata-ts pod runs through the installed handler (one VM), then is stopped and removed', { timeout: scaledMs(900_000) }, async () => {
    const config = sandboxConfig('installed');
    await fsp.mkdir(config.log_directory!, { recursive: true });
    const id = (
      await node.cri.runtime.RunPodSandbox({ config, runtime_handler: KATA_TS_HANDLER }, { deadline: Date.now() + scaledMs(600_000) })
    ).pod_sandbox_id;
    expect((await node.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id })).status?.state).toBe('SANDBOX_READY');
    const podDir = path.join(node.stateRoot, 'k8s.io', id.slice(0, 16));
    expect(liveProcessesMentioning(podDir).length).toBeGreaterThan(0); // QEMU and virtiofsd name the pod's dir
    await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
    await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    await until('no process of the pod', async (note) => {
      const left = liveProcessesMentioning(podDir);
      note(left);
      return left.length === 0 ? true : undefined;
    });
  });

  it('uninstall: the config byte for byte as before; containerd restarted lists no kata-ts handler', async () => {
    const config = node.ctrd.configPath;
    const done = await kataTs(['uninstall', '--containerd', '--config', config]);
    expect(done.code, done.stderr).toBe(0);
    expect(done.stdout).toContain(`kata-ts uninstall: restored ${config} from ${config}.kata-ts-backup`);
    expect(await fsp.readFile(config, 'utf8')).toBe(original);
    expect((await fsp.readdir(path.dirname(config))).filter((f) => f.startsWith('config.toml'))).toEqual(['config.toml']);
    const again = await kataTs(['uninstall', '--containerd', '--config', config]);
    expect(again.stdout).toContain('nothing changed');

    await restart();
    expect(Object.keys(await criRuntimes())).toEqual(['runc']);
    await expect(node.cri.runtime.RunPodSandbox({ config: sandboxConfig('late'), runtime_handler: KATA_TS_HANDLER })).rejects.toThrow(
      /no runtime for "kata-ts" is configured/,
    );
  });
});
