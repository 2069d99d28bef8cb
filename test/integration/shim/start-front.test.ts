/**
 * The native front of `start` (native/shim-start.c, `dist/native/kata-ts-shim-start`; docs/shim.md
 * "The start fast path"): what containerd sees through it must be what the Node shim alone gives.
 *
 * 1. Without containerd or a VM, each case run twice, through the front (also as a link named
 *    containerd-shim-kata-ts-v2) and through the Node shim alone (the sources, through tsx), and
 *    the two answers compared (exit code, stdout, stderr,
 *    the bundle's `address`): a container whose pod's socket answers (a listener of the test's
 *    stands for the pod's server) takes the fast path once a Node start has stamped the config,
 *    and every other case falls back to Node (no stamp yet, the config edited since, `-info`,
 *    `-v`, a bad namespace, a socket nobody answers on, a bundle that is not JSON, an escaped
 *    annotation key, a stamp another code tree left), which the front's decision log
 *    (KATA_TS_SHIM_START_LOG) confirms.
 * 2. Through a real containerd (sid's 2.1.9 when it can be fetched, else Debian's 1.6): the test
 *    shim's wrapper goes through the front; a pod and its container run, the sandbox's start
 *    went to Node (its server did not run yet) and the container's took the fast path, and the
 *    container's output reaches its CRI log. One VM boot.
 */
import { execFile } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, promises as fsp, realpathSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import type { PodSandboxConfig } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { START_STAMP_FILE } from '../../../src/shim/start-stamp.js';
import { pushBusyboxImage } from '../../helpers/busybox-image.js';
import { containerdMissing, KATA_TS_HANDLER } from '../../helpers/containerd.js';
import { type ContainerdRelease, containerdRelease } from '../../helpers/containerd-releases.js';
import { untilLogLines } from '../../helpers/poll.js';
import { guestDirConfig } from '../../helpers/runtime-daemon.js';
import { ShimNode } from '../../helpers/shim-node.js';
import { scaledMs } from '../../helpers/time-scale.js';

const FRONT = path.join(packageRoot(), 'dist', 'native', 'kata-ts-shim-start');
const SHIM = path.join(packageRoot(), 'bin', 'containerd-shim-kata-ts-v2');
const frontBuilt = existsSync(FRONT);
if (!frontBuilt) console.warn(`the start front's test skipped: ${FRONT} is not built (scripts/build-native.sh)`);

interface Answer {
  code: number;
  stdout: string;
  stderr: string;
}

function run(argv: readonly string[], env: NodeJS.ProcessEnv, stdin = ''): Promise<Answer> {
  return new Promise((resolve) => {
    const child = execFile(argv[0]!, argv.slice(1), { env, encoding: 'latin1', timeout: scaledMs(120_000) }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
    child.stdin?.end(stdin);
  });
}

describe.skipIf(!frontBuilt)('the start front answers as the Node shim does (no containerd, no VM)', () => {
  let dir = '';
  let stateRoot = '';
  let configPath = '';
  let logPath = '';
  const address = '/run/kata-ts-test/containerd.sock';
  const sandboxId = 'sandbox-of-the-front-test';
  let server: net.Server | undefined;
  let seq = 0;

  const env = (): NodeJS.ProcessEnv => ({
    ...process.env,
    KATA_TS_CONFIG: configPath,
    KATA_TS_SHIM_TSX: '1',
    KATA_TS_SHIM_START_LOG: logPath,
  });
  const bundle = async (configText: string): Promise<string> => {
    const b = path.join(dir, 'bundles', String(seq++));
    await fsp.mkdir(b, { recursive: true });
    await fsp.writeFile(path.join(b, 'config.json'), configText);
    return b;
  };
  const containerSpec = (sid = sandboxId) =>
    JSON.stringify({
      ociVersion: '1.1.0',
      annotations: { 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': sid },
    });
  const shimArgs = (id: string, b: string, ...rest: string[]) => [
    '-namespace',
    'k8s.io',
    '-address',
    address,
    '-publish-binary',
    '/bin/true',
    '-id',
    id,
    '-bundle',
    b,
    ...rest,
  ];
  const viaFront = (args: readonly string[], stdin = '') => run([FRONT, process.execPath, SHIM, '--', ...args], env(), stdin);
  const viaNode = (args: readonly string[], stdin = '') => run([process.execPath, SHIM, ...args], env(), stdin);
  /** The front's decision log lines since `from`. */
  const decisions = async (from: number): Promise<string[]> =>
    (await fsp.readFile(logPath, 'utf8').catch(() => ''))
      .slice(from)
      .split('\n')
      .filter((l) => l !== '');
  const logSize = async (): Promise<number> => (await fsp.readFile(logPath, 'utf8').catch(() => '')).length;
  /** One case through both ways (the front first), each in a bundle of its own: both answers and the front's decision. */
  const compare = async (id: string, spec: string, rest: string[] = ['start'], stdin = '') => {
    const from = await logSize();
    const b1 = await bundle(spec);
    const front = await viaFront(shimArgs(id, b1, ...rest), stdin);
    const decision = await decisions(from);
    const b2 = await bundle(spec);
    const node = await viaNode(shimArgs(id, b2, ...rest), stdin);
    const addr = async (b: string) => fsp.readFile(path.join(b, 'address'), 'utf8').catch(() => null);
    // The bundle's path is in no answer of a start; a message naming the bundle is compared with the path made the same.
    const same = (s: string) => s.replaceAll(b1, '<bundle>').replaceAll(b2, '<bundle>');
    return {
      front: { ...front, stderr: same(front.stderr) },
      node: { ...node, stderr: same(node.stderr) },
      decision,
      addresses: [await addr(b1), await addr(b2)],
    };
  };

  beforeAll(async () => {
    dir = await fsp.mkdtemp('/tmp/ktsf-');
    stateRoot = path.join(dir, 'st');
    configPath = path.join(dir, 'kata-ts.json');
    logPath = path.join(dir, 'front.log');
    await fsp.writeFile(
      configPath,
      JSON.stringify({
        stateDir: path.join(dir, 'unused'),
        socketPath: path.join(dir, 'unused.sock'),
        metricsAddress: null,
        cgroupDriver: 'cgroupfs',
        network: { mode: 'none' },
        mountNamespacePath: null,
        shim: { stateRoot },
      }),
    );
    const digest = createHash('sha256')
      .update(path.posix.join(address, 'k8s.io', sandboxId))
      .digest('hex');
    const sock = path.join(stateRoot, 's', digest);
    await fsp.mkdir(path.dirname(sock), { recursive: true, mode: 0o700 });
    server = net.createServer((c) => c.destroy());
    await new Promise<void>((resolve) => server!.listen(sock, resolve));
  }, scaledMs(60_000));

  afterAll(async () => {
    server?.close();
    if (dir !== '') await fsp.rm(dir, { recursive: true, force: true });
  });

  it('a container whose pod answers: Node until a Node start stamped the config, then the fast path, with the same answer', {
    timeout: scaledMs(180_000),
  }, async () => {
    const first = await compare('app-1', containerSpec());
    expect(first.decision).toEqual(['fallback app-1: no stamp of a Node start for the config as it is now']);
    expect(first.front).toEqual(first.node);
    expect(first.front.code).toBe(0);
    expect(first.front.stdout).toMatch(/^unix:\/\/\/tmp\/ktsf-[^/]+\/st\/s\/[0-9a-f]{64}$/);
    const stamp = await fsp.readFile(path.join(stateRoot, START_STAMP_FILE), 'utf8');
    expect(stamp).toContain(`\ncode ${realpathSync(packageRoot())}\nconfig ${configPath}\n`);

    // Runtime options on stdin (containerd 2.x writes them) are read and dropped on both ways.
    const fast = await compare('app-2', containerSpec(), ['start'], 'x'.repeat(200_000));
    expect(fast.decision).toEqual(['fast app-2']);
    expect(fast.front).toEqual(fast.node);
    expect(fast.addresses[0]).toBe(fast.front.stdout);
    expect(fast.addresses[1]).toBe(fast.front.stdout);
    // The address file as writeFileAtomic leaves it: 0644 less the umask, no temporary file beside it.
    const b = path.join(dir, 'bundles', String(seq - 2));
    expect((await fsp.stat(path.join(b, 'address'))).mode & 0o777).toBe(0o644 & ~process.umask());
    expect((await fsp.readdir(b)).sort()).toEqual(['address', 'config.json']);

    // As a link under the shim's own name (what containerd would exec): the same, and its fallback is
    // this tree's bin/containerd-shim-kata-ts-v2.
    const link = path.join(dir, 'containerd-shim-kata-ts-v2');
    await fsp.symlink(FRONT, link);
    const from = await logSize();
    const b3 = await bundle(containerSpec());
    const linked = await run([link, ...shimArgs('app-3', b3, 'start')], env());
    expect(await decisions(from)).toEqual(['fast app-3']);
    expect(linked).toEqual(fast.front);
    expect([await run([link, '-v'], env()), await decisions(from)]).toEqual([
      await viaNode(['-v']),
      ['fast app-3', 'fallback : a flag the fast path leaves to Node'],
    ]);

    // The sandbox's own start repeated while it is served (containerd retrying): fast too.
    const again = await compare(sandboxId, JSON.stringify({ annotations: { 'io.kubernetes.cri.container-type': 'sandbox' } }));
    expect(again.decision).toEqual([`fast ${sandboxId}`]);
    expect(again.front).toEqual(again.node);
  });

  it("every other case goes to Node, and the answer is Node's", { timeout: scaledMs(600_000) }, async () => {
    const cases: Array<[string, string, string[], string, RegExp]> = [
      ['info', containerSpec(), ['-info'], '', /a flag the fast path leaves to Node/],
      ['version', containerSpec(), ['-v'], '', /a flag the fast path leaves to Node/],
      ['no-pod', containerSpec('nobody-serves-this'), ['start'], '', /the pod's socket does not answer/],
      ['not-json', '{"annotations": {', ['start'], '', /is not a JSON object/],
      [
        'escaped',
        '{"annotations": {"io.kubernetes.cri\\u002dcontainer-type": "container", "io.kubernetes.cri.sandbox-id": "x"}}',
        ['start'],
        '',
        /escaped keys/,
      ],
      ['delete-is-node', containerSpec(), ['delete'], '', /not a start/],
    ];
    for (const [id, spec, rest, stdin, why] of cases) {
      // delete would clean up a pod: only its decision is checked, through the front alone.
      if (rest[0] === 'delete') {
        const from = await logSize();
        await viaFront(shimArgs(id, await bundle(spec), ...rest));
        const [line] = await decisions(from);
        expect(line).toMatch(why);
        continue;
      }
      const r = await compare(id, spec, rest, stdin);
      expect(r.decision, id).toHaveLength(1);
      expect(r.decision[0], id).toMatch(why);
      expect(r.front, id).toEqual(r.node);
    }
    // A namespace that is no identifier: Node's exit code and sentence.
    const from = await logSize();
    const front = await viaFront(['-namespace', 'bad/ns', '-address', address, '-id', 'x', 'start']);
    const node = await viaNode(['-namespace', 'bad/ns', '-address', address, '-id', 'x', 'start']);
    expect(await decisions(from)).toEqual(['fallback x: the namespace is not plain']);
    expect(front).toEqual(node);
    expect(front.code).toBe(1);

    // The config edited (even rewritten the same): its ctime moved, so Node judges it again, and stamps it anew.
    await fsp.writeFile(configPath, await fsp.readFile(configPath));
    const edited = await compare('app-edited', containerSpec());
    expect(edited.decision).toEqual(['fallback app-edited: no stamp of a Node start for the config as it is now']);
    expect(edited.front).toEqual(edited.node);
    const restamped = await compare('app-restamped', containerSpec());
    expect(restamped.decision).toEqual(['fast app-restamped']);
    // A stamp another code tree (another release) left: Node judges the config again.
    const stampFile = path.join(stateRoot, START_STAMP_FILE);
    await fsp.writeFile(
      stampFile,
      (await fsp.readFile(stampFile, 'utf8')).replace(/\ncode [^\n]*\n/, '\ncode /opt/kata-ts/releases/other\n'),
    );
    const otherTree = await compare('app-other-tree', containerSpec());
    expect(otherTree.decision).toEqual(['fallback app-other-tree: no stamp of a Node start for the config as it is now']);
    expect(otherTree.front).toEqual(otherTree.node);
    expect(await fsp.readFile(stampFile, 'utf8')).toContain(`\ncode ${realpathSync(packageRoot())}\n`);
    // A config Node refuses is never served by the fast path: the stamp names the file as it was.
    await fsp.writeFile(configPath, JSON.stringify({ shim: { stateRoot }, logLevel: 'loud' }));
    const refused = await compare('app-refused', containerSpec());
    expect(refused.decision).toEqual(['fallback app-refused: no stamp of a Node start for the config as it is now']);
    expect(refused.front).toEqual(refused.node);
    expect(refused.front.code).toBe(1);
  });
});

let release: ContainerdRelease | null = null;
const missing = containerdMissing();
if (missing === null && frontBuilt) {
  const r21 = await containerdRelease('2.1');
  release = r21.release ?? (await containerdRelease('1.6')).release;
}

describe.skipIf(missing !== null || !frontBuilt || release === null)('the start front behind containerd', () => {
  const node = new ShimNode('/tmp/ktsg-');
  let podId = '';
  let appId = '';
  let logDir = '';
  const uid = randomUUID();
  const sandboxConfig = (): PodSandboxConfig => ({
    metadata: { name: 'front', uid, namespace: 'default', attempt: 0 },
    log_directory: logDir,
    linux: { cgroup_parent: `/kubepods/burstable/pod${uid}` },
  });

  beforeAll(async () => {
    await node.start({
      shimConfig: { hypervisor: { ...guestDirConfig(), readyTimeoutMs: scaledMs(480_000) } },
      containerd: { ...(release!.label === '1.6' ? {} : { release: release! }) },
    });
    // The test shim's wrapper execs the front, which execs the Node shim when it does not answer itself.
    const wrapper = path.join(node.binDir, 'containerd-shim-kata-ts-v2');
    const script = await fsp.readFile(wrapper, 'utf8');
    const log = path.join(node.dir, 'front.log');
    const fronted = script
      .replace(`exec ${process.execPath} `, `export KATA_TS_SHIM_START_LOG=${log}\nexec ${FRONT} ${process.execPath} `)
      .replace(' "$@"', ' -- "$@"');
    expect(fronted).toContain(`exec ${FRONT} `);
    await fsp.writeFile(wrapper, fronted);
    logDir = await node.podLogDir('front', uid);
  }, scaledMs(300_000));

  afterAll(async () => {
    if (podId !== '') {
      await node.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
      await node.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
    }
    await node.stop();
  }, scaledMs(600_000));

  it('a pod and its container: the sandbox started by Node, the container by the fast path, its output in the CRI log', {
    timeout: scaledMs(1_200_000),
  }, async () => {
    const image = await pushBusyboxImage(node.registry, 'kata-ts/busybox', 'front', ['sleep']);
    await node.cri.image.PullImage({ image: { image } });
    const slow = () => ({ deadline: Date.now() + scaledMs(600_000) });
    podId = (await node.cri.runtime.RunPodSandbox({ config: sandboxConfig(), runtime_handler: KATA_TS_HANDLER }, slow())).pod_sandbox_id;
    appId = (
      await node.cri.runtime.CreateContainer(
        {
          pod_sandbox_id: podId,
          config: {
            metadata: { name: 'app', attempt: 0 },
            image: { image },
            command: ['sh', '-c', 'echo started; sleep 1000'],
            log_path: 'app.log',
          },
          sandbox_config: sandboxConfig(),
        },
        slow(),
      )
    ).container_id;
    await node.cri.runtime.StartContainer({ container_id: appId }, slow());
    await untilLogLines('the container output', [path.join(logDir, 'app.log')], (l) => l.some((x) => x.includes('stdout F started')));
    const lines = (await fsp.readFile(path.join(node.dir, 'front.log'), 'utf8')).split('\n');
    expect(lines).toContain(`fallback ${podId}: no stamp of a Node start for the config as it is now`);
    expect(lines).toContain(`fast ${appId}`);
  });
});
