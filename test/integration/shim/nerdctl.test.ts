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
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatVersion } from '../../../src/install/version.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, mountPointsUnder } from '../../helpers/containerd.js';
import { type ContainerdRelease, containerdRelease } from '../../helpers/containerd-releases.js';
import { containerdReleasesFor, findNerdctl, type NerdctlRun, nerdctlGlobalArgs, prepareNerdctlRoots } from '../../helpers/nerdctl.js';
import { until } from '../../helpers/poll.js';
import { liveProcessesMentioning } from '../../helpers/processes.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
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

/** What a test checks of a single-container pod on `node` (namespace NS): its state dir, its QEMU, and that nothing of it is left. */
function podChecks(node: ShimNode) {
  const podDir = (id: string) => path.join(node.stateRoot, NS, id.slice(0, 16));
  const qemuOf = (id: string) =>
    liveProcessesMentioning(podDir(id)).filter((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('qemu-system'));
  const runtimeMountinfo = () => node.ctrd.nodeExec(['nsenter', `--mount=${node.mountNamespacePath}`, '--', 'cat', '/proc/self/mountinfo']);
  /** No QEMU or shim, no state dir, no mount in either namespace, no cgroup of it. */
  const expectNothingLeft = async (id: string) => {
    await until(`no process of ${id}`, async (note) => {
      const left = [...liveProcessesMentioning(podDir(id)), ...liveProcessesMentioning(`-id\u0000${id}\u0000`)];
      // Which processes (their command lines), so that a failure says what lingered.
      note(left.map((pid) => `${pid}: ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\u0000', ' ').slice(0, 300)}`));
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
  };
  return { podDir, qemuOf, expectNothingLeft };
}

/** The busybox image pushed to the node's registry and pulled into NS by the release's own ctr (plain HTTP, loopback). */
async function pullBusybox(node: ShimNode, release: ContainerdRelease): Promise<string> {
  const image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'nerdctl', ['sleep', 'nproc', 'grep', 'cat']);
  await node.ctrd.nodeExec([ctrOf(release), '--address', node.ctrd.grpcAddress, '-n', NS, 'image', 'pull', '--plain-http', image], 120_000);
  return image;
}

function ctrOf(release: ContainerdRelease): string {
  return release.binDir !== null && existsSync(path.join(release.binDir, 'ctr')) ? path.join(release.binDir, 'ctr') : 'ctr';
}

/**
 * The shim's config: the test guest, and a boot budget (guest ready and the agent's Hello) sized
 * for a machine shared with other VM-booting jobs rather than the 90 s default for an idle node.
 */
const SHIM_CONFIG = { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(240_000) } };

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
    const { qemuOf, expectNothingLeft: nothingOfPodLeft } = podChecks(node);
    /** nerdctl's logging processes (`nerdctl _NERDCTL_INTERNAL_LOGGING <data store>`) of this test's data root. */
    const loggers = () => liveProcessesMentioning(`_NERDCTL_INTERNAL_LOGGING\u0000${path.join(node.dir, 'nerdctl', 'data')}/`);
    const expectNothingLeft = async (id: string) => {
      await nothingOfPodLeft(id);
      // containerd knows it no more.
      expect((await ok(['ps', '-a', '-q', '--no-trunc'])).split('\n')).not.toContain(id);
    };

    beforeAll(async () => {
      await node.start({ containerd: { release: RELEASE! }, shimConfig: SHIM_CONFIG });
      env = await prepareNerdctlRoots(node.dir);
      image = await pullBusybox(node, RELEASE!);
    });

    afterAll(async () => {
      // A failed test's containers go first (the VMs with them), then the node.
      if (node.dir !== '') for (const name of made) await nerdctl(['rm', '-f', name], 120_000).catch(() => undefined);
      await node.stop();
    });

    it("nerdctl run --rm (foreground): the output on nerdctl's stdout and stderr, the exit code, a VM sized from --cpus/--memory; nothing left", {
      timeout: scaledMs(480_000),
    }, async () => {
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

    it('nerdctl run -d: nerdctl logs (its binary:// logger, run by the shim), exec, stop (SIGTERM), rm leave nothing', {
      timeout: scaledMs(480_000),
    }, async () => {
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

/**
 * A stand-in for what `nerdctl run --rm` (foreground) hands the shim, driven by the same
 * release's `ctr`, because nerdctl itself cannot be had on this machine. Named so: this is not
 * nerdctl. It reproduces the shim-facing part of nerdctl's run as read from nerdctl's source
 * (pkg/cmd/container/create.go, pkg/taskutil): a 64-hex container id, its first 12 digits as the
 * hostname, `nerdctl/*` annotations (JSON values among them), /etc/hosts, /etc/hostname and
 * /etc/resolv.conf bound from a data root under the test's dir, containerd's FIFOs for stdio (a
 * foreground run's), and the container's CPU and memory limits. Not reproduced: nerdctl's OCI
 * hooks (ctr cannot add them; the shim does not run OCI hooks), its swap limit and zero
 * real-time pair (decoded in test/unit/shim/decode/solo-nerdctl.test.ts).
 */
const STAND_IN = NERDCTL === null ? await containerdRelease('2.1') : { release: null, missing: 'the real nerdctl runs above' };
const STAND_IN_MISSING = STAND_IN.missing ?? containerdMissing(STAND_IN.release ?? undefined);
if (STAND_IN_MISSING !== null) console.warn(`the ctr stand-in for nerdctl's foreground run skipped: ${STAND_IN_MISSING}`);

describe.skipIf(STAND_IN_MISSING !== null)(
  `stand-in (ctr, not nerdctl): nerdctl's foreground run as the shim sees it, behind containerd ${STAND_IN.release === null ? '' : formatVersion(STAND_IN.release.version)}`,
  () => {
    const node = new ShimNode('/tmp/ktnd-');
    const release = STAND_IN.release as ContainerdRelease;
    const { expectNothingLeft } = podChecks(node);
    let image = '';
    const id = 'c3f1e0a2b4d6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081';

    const ctr = (args: string[], timeoutMs = 60_000): Promise<NerdctlRun> =>
      new Promise((resolve, reject) => {
        const child = execFile(
          'nsenter',
          [
            `--target=${node.ctrd.nodePid}`,
            '--mount',
            '--net',
            '--',
            ctrOf(release),
            '--address',
            node.ctrd.grpcAddress,
            '-n',
            NS,
            ...args,
          ],
          { timeout: scaledMs(timeoutMs), maxBuffer: 16 << 20 },
          (err, stdout, stderr) => {
            const code =
              err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code as number) : -1;
            if (code === -1) reject(new Error(`ctr ${args.join(' ')}: ${err?.message} ${stderr}`));
            else resolve({ code, stdout, stderr });
          },
        );
        // A foreground nerdctl run without -i gives the container no stdin: ctr's copy of it ends at once.
        child.stdin?.end();
      });

    beforeAll(async () => {
      await node.start({ containerd: { release }, shimConfig: SHIM_CONFIG });
      image = await pullBusybox(node, release);
    });

    afterAll(async () => {
      if (node.dir !== '') {
        await ctr(['task', 'kill', '-s', 'SIGKILL', id]).catch(() => undefined);
        await ctr(['task', 'rm', '-f', id], 120_000).catch(() => undefined);
        await ctr(['container', 'rm', id]).catch(() => undefined);
      }
      await node.stop();
    });

    it('a 64-hex id, nerdctl/* annotations, its hosts/hostname/resolv.conf binds, FIFO stdio, --cpus 1 --memory 768m: output, exit code, the guest sized from them, nothing left', {
      timeout: scaledMs(480_000),
    }, async () => {
      // nerdctl's files for the container, under a data root of the test's own.
      const data = path.join(node.dir, 'nerdctl', 'data', '1935db59');
      const containerDir = path.join(data, 'containers', NS, id);
      const hostsDir = path.join(data, 'etchosts', NS, id);
      await fsp.mkdir(containerDir, { recursive: true });
      await fsp.mkdir(hostsDir, { recursive: true });
      await fsp.writeFile(path.join(containerDir, 'resolv.conf'), 'nameserver 127.0.0.53\n');
      await fsp.writeFile(path.join(containerDir, 'hostname'), `${id.slice(0, 12)}\n`);
      await fsp.writeFile(path.join(hostsDir, 'hosts'), '127.0.0.1 localhost\n');
      const annotations: Record<string, string> = {
        'nerdctl/namespace': NS,
        'nerdctl/name': 'kts-fg',
        'nerdctl/hostname': id.slice(0, 12),
        'nerdctl/networks': '["none"]',
        'nerdctl/state-dir': containerDir,
        'nerdctl/platform': 'linux/amd64',
        'nerdctl/dns': '{"DNSServers":null,"DNSResolvConfOptions":null,"DNSSearchDomains":null}',
        'nerdctl/log-config': '{"driver":"json-file","opts":{}}',
        'nerdctl/auto-remove': 'true',
      };
      const bind = (src: string, dst: string) => ['--mount', `type=bind,src=${src},dst=${dst},options=bind:rprivate`];
      const r = await ctr(
        [
          'run',
          '--rm',
          '--runtime',
          RUNTIME,
          '--hostname',
          id.slice(0, 12),
          '--cpus',
          '1',
          '--memory-limit',
          String(768 * 1024 * 1024),
          ...Object.entries(annotations).flatMap(([k, v]) => ['--annotation', `${k}=${v}`]),
          ...bind(path.join(containerDir, 'resolv.conf'), '/etc/resolv.conf'),
          ...bind(path.join(hostsDir, 'hosts'), '/etc/hosts'),
          ...bind(path.join(containerDir, 'hostname'), '/etc/hostname'),
          image,
          id,
          'sh',
          '-c',
          'echo hello nerdctl; echo to stderr >&2; echo nproc=$(nproc); grep MemTotal /proc/meminfo; echo host=$(hostname); exit 3',
        ],
        300_000,
      );
      expect(r.code, r.stderr).toBe(3);
      expect(r.stdout).toContain('hello nerdctl\n');
      expect(r.stderr).toContain('to stderr\n');
      expect(r.stdout).toContain('nproc=2\n');
      expect(r.stdout).toContain(`host=${id.slice(0, 12)}\n`);
      const memTotalKiB = Number(/MemTotal:\s+(\d+) kB/.exec(r.stdout)?.[1]);
      expect(memTotalKiB).toBeGreaterThan(768 * 1024);
      await expectNothingLeft(id);
      expect((await ctr(['container', 'ls', '-q'])).stdout.split('\n')).not.toContain(id);
    });
  },
);
