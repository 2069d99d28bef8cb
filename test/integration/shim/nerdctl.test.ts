/**
 * kata-ts's shim in single-container mode driven by the real nerdctl (test/helpers/nerdctl.ts:
 * KATA_TS_NERDCTL, Debian's `nerdctl` package of trixie or sid, or PATH) behind a real containerd
 * the test starts (test/helpers/containerd.ts, the newest release that nerdctl supports:
 * sid's 2.x for nerdctl 2, trixie's 1.7 for nerdctl 1). Every nerdctl root is under the test's
 * dir (data root, CNI config dir, config file); containers run with `--net none`, so no network
 * outside the node's own namespace is made. Two VMs are booted:
 *
 * 1. `nerdctl run --rm` in the foreground: nerdctl hands the shim containerd's FIFOs and copies
 *    them to its own stdout and stderr; the VM is sized from `--cpus`/`--memory` (the guest's
 *    `nproc` and MemTotal, read inside the container); nerdctl exits with the container's code and
 *    removes it: no QEMU, shim, mount, cgroup or state is left.
 * 2. `nerdctl run -d`: the shim gets `binary://<nerdctl>?_NERDCTL_INTERNAL_LOGGING=<data root>`
 *    and runs nerdctl's own logger; `nerdctl logs` shows stdout and stderr; `nerdctl exec` runs in
 *    the container; `nerdctl stop` delivers SIGTERM (the container's trap answers it);
 *    `nerdctl rm` leaves nothing, nerdctl's logger included.
 *
 * Skipped with a notice naming why when no nerdctl runs here (Debian carries no `nerdctl` package
 * as of this writing: set KATA_TS_NERDCTL to an upstream binary) or the containerd it needs
 * cannot be fetched.
 */
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatVersion } from '../../../src/install/version.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, mountPointsUnder } from '../../helpers/containerd.js';
import { type ContainerdRelease, containerdRelease } from '../../helpers/containerd-releases.js';
import { containerdReleasesFor, findNerdctl, type NerdctlRun, nerdctlGlobalArgs, prepareNerdctlRoots } from '../../helpers/nerdctl.js';
import { until } from '../../helpers/poll.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const FOUND = await findNerdctl();
const NERDCTL = FOUND.nerdctl;
let RELEASE: ContainerdRelease | null = null;
const releaseMissing: string[] = [];
if (NERDCTL !== null) {
  for (const label of containerdReleasesFor(NERDCTL.version)) {
    const r = await containerdRelease(label);
    if (r.release !== null && containerdMissing(r.release) === null) {
      RELEASE = r.release;
      break;
    }
    releaseMissing.push(r.missing ?? containerdMissing(r.release ?? undefined) ?? `containerd ${label}`);
  }
}
const MISSING =
  FOUND.missing ??
  (RELEASE === null ? `no containerd that ${NERDCTL?.versionText} supports runs here: ${releaseMissing.join('; ')}` : null);
if (MISSING !== null) console.warn(`kata-ts single-container mode through nerdctl skipped: ${MISSING}`);

/** A containerd namespace of the test's own. */
const NS = 'nerdctl-test';
const RUNTIME = 'io.containerd.kata-ts.v2';
/** A container id as nerdctl makes them: 64 hex digits. */
const ID = /^[0-9a-f]{64}$/;

describe.skipIf(MISSING !== null)(
  `single-container mode: ${NERDCTL?.versionText} (${NERDCTL?.source}) behind containerd ${RELEASE === null ? '' : formatVersion(RELEASE.version)}`,
  () => {
    const node = new ShimNode('/tmp/ktn-');
    let image = '';
    let env: Record<string, string> = {};
    /** Names of containers made, removed in afterAll when a test failed half-way. */
    const made: string[] = [];

    /** nerdctl inside the harness's node (its mount and network namespaces); never rejects on an exit code. */
    const nerdctl = (args: string[], timeoutMs = 60_000): Promise<NerdctlRun> =>
      new Promise((resolve, reject) => {
        execFile(
          'nsenter',
          [
            `--target=${node.ctrd.nodePid}`,
            '--mount',
            '--net',
            '--',
            NERDCTL!.binary,
            ...nerdctlGlobalArgs({ dir: node.dir, address: node.ctrd.grpcAddress, namespace: NS }),
            ...args,
          ],
          { timeout: scaledMs(timeoutMs), env, maxBuffer: 16 << 20 },
          (err, stdout, stderr) => {
            const code =
              err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code as number) : -1;
            if (code === -1) reject(new Error(`nerdctl ${args.join(' ')}: ${err?.message} ${stderr}`));
            else resolve({ code, stdout, stderr });
          },
        );
      });
    const ok = async (args: string[], timeoutMs?: number): Promise<string> => {
      const r = await nerdctl(args, timeoutMs);
      if (r.code !== 0) throw new Error(`nerdctl ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
      return r.stdout;
    };
    const podDir = (id: string) => path.join(node.stateRoot, NS, id.slice(0, 16));
    const qemuOf = (id: string) =>
      liveProcessesMentioning(podDir(id)).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
    const runtimeMountinfo = () =>
      node.ctrd.nodeExec(['nsenter', `--mount=${node.mountNamespacePath}`, '--', 'cat', '/proc/self/mountinfo']);
    /** nerdctl's logging processes for this test's data root (the shim starts them for `-d`). */
    const loggers = () => liveProcessesMentioning(path.join(node.dir, 'nerdctl', 'data'));

    /** Nothing of the container's pod is left: no QEMU or shim, no state dir, no mount in either namespace, no cgroup. */
    const expectNothingLeft = async (id: string) => {
      await until(`no process of ${id}`, async (note) => {
        const left = [...liveProcessesMentioning(podDir(id)), ...liveProcessesMentioning(`-id\u0000${id}\u0000`)];
        note(left);
        return left.length === 0 ? true : undefined;
      });
      await until(`the state of ${id} removed`, async (note) => {
        note(existsSync(podDir(id)));
        return existsSync(podDir(id)) ? undefined : true;
      });
      expect(await node.ctrd.mountsUnder(node.stateRoot)).toEqual([]);
      expect(mountPointsUnder(await runtimeMountinfo(), podDir(id))).toEqual([]);
      expect(await node.ctrd.mountsUnder(node.ctrd.bundleDir(id))).toEqual([]);
      expect((await node.ctrd.podCgroups()).filter((c) => c.includes(id))).toEqual([]);
      // containerd knows it no more.
      expect((await ok(['ps', '-a', '-q', '--no-trunc'])).split('\n')).not.toContain(id);
    };

    beforeAll(async () => {
      await node.start({ containerd: { release: RELEASE! } });
      env = await prepareNerdctlRoots(node.dir);
      image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'nerdctl', ['sleep', 'nproc', 'grep', 'cat']);
      // The release's own ctr pulls it over plain HTTP from the loopback registry (as containerd-ctr.test.ts).
      const binDir = RELEASE!.binDir;
      const ctr = binDir !== null && existsSync(path.join(binDir, 'ctr')) ? path.join(binDir, 'ctr') : 'ctr';
      await node.ctrd.nodeExec([ctr, '--address', node.ctrd.grpcAddress, '-n', NS, 'image', 'pull', '--plain-http', image], 120_000);
    });

    afterAll(async () => {
      // A failed test's containers go first (the VMs with them), then the node.
      if (node.dir !== '') for (const name of made) await nerdctl(['rm', '-f', name], 120_000).catch(() => undefined);
      await node.stop();
    });

    it("nerdctl run --rm (foreground): the output on nerdctl's stdout and stderr, the exit code, a VM sized from --cpus/--memory; nothing left", async () => {
      const cidfile = path.join(node.dir, 'fg.cid');
      made.push('kts-fg');
      const r = await nerdctl(
        [
          'run',
          '--rm',
          '--net',
          'none',
          '--runtime',
          RUNTIME,
          '--name',
          'kts-fg',
          '--cidfile',
          cidfile,
          '--cpus',
          '1',
          '--memory',
          '768m',
          image,
          'sh',
          '-c',
          'echo hello nerdctl; echo to stderr >&2; echo nproc=$(nproc); grep MemTotal /proc/meminfo; exit 3',
        ],
        300_000,
      );
      expect(r.code, r.stderr).toBe(3);
      expect(r.stdout).toContain('hello nerdctl\n');
      expect(r.stderr).toContain('to stderr\n');
      // 1 CPU + the guest's 250m overhead are 2 vCPUs; the default VM (no limits) has 1.
      expect(r.stdout).toContain('nproc=2\n');
      // 768 MiB + the handler's guest overhead: more than the container's limit, and more than
      // the 512 MiB a VM gets without limits. The guest's kernel keeps some for itself.
      const memTotalKiB = Number(/MemTotal:\s+(\d+) kB/.exec(r.stdout)?.[1]);
      expect(memTotalKiB).toBeGreaterThan(768 * 1024);
      const id = readFileSync(cidfile, 'utf8').trim();
      expect(id).toMatch(ID);
      await expectNothingLeft(id);
      expect(loggers()).toEqual([]);
    });

    it('nerdctl run -d: nerdctl logs (its binary:// logger, run by the shim), exec, stop (SIGTERM), rm leave nothing', async () => {
      made.push('kts-bg');
      const script = "trap 'echo got TERM; exit 42' TERM; echo hello logs; echo err line >&2; while :; do sleep 1 & wait $!; done";
      const id = (
        await ok(['run', '-d', '--net', 'none', '--runtime', RUNTIME, '--name', 'kts-bg', image, 'sh', '-c', script], 300_000)
      ).trim();
      expect(id).toMatch(ID);
      // One QEMU for it; the shim started nerdctl's logger, which writes nerdctl's json log.
      expect(qemuOf(id)).toHaveLength(1);
      expect(loggers().length).toBeGreaterThan(0);
      await until('the output in nerdctl logs', async (note) => {
        const logs = await nerdctl(['logs', 'kts-bg']);
        note(logs);
        return logs.code === 0 && logs.stdout.includes('hello logs\n') && logs.stderr.includes('err line\n') ? true : undefined;
      });
      // An exec runs in the container, in the VM (no limits: the default single vCPU).
      const exec = await ok(['exec', 'kts-bg', 'sh', '-c', 'echo exec out; nproc; echo exec err >&2']);
      expect(exec).toBe('exec out\n1\n');
      // stop: SIGTERM reaches the container's process, whose trap writes and exits 42.
      await ok(['stop', '-t', '60', 'kts-bg'], 120_000);
      expect((await ok(['inspect', '--format', '{{.State.ExitCode}}', 'kts-bg'])).trim()).toBe('42');
      await until('got TERM in nerdctl logs', async (note) => {
        const logs = await ok(['logs', 'kts-bg']);
        note(logs);
        return logs.includes('got TERM\n') ? true : undefined;
      });
      await ok(['rm', 'kts-bg'], 120_000);
      await expectNothingLeft(id);
      await until("nerdctl's logger gone", async (note) => {
        const left = loggers();
        note(left);
        return left.length === 0 ? true : undefined;
      });
    });
  },
);
