/**
 * What the shim v2 face will ask of the core, on one real pod VM (TCG) with the real agent and crun
 * in the guest, the managers composed in this process as `kata-ts serve` composes them (no CRI
 * face: the options are the core's API, not the CRI's): ContainerManager.create with a caller's id,
 * a root filesystem the caller prepared (a busybox directory, as containerd's snapshot would be at
 * `<bundle>/rootfs`) and containerd-style FIFOs. The container's stdout and stderr arrive as raw
 * bytes in their FIFOs, bytes written to the stdin FIFO reach `cat`, the FIFO writer's close ends
 * its stdin, waitExit gives the exit code, kill signals a running container, and the caller's
 * directory is untouched after remove.
 */
import { execFileSync } from 'node:child_process';
import { closeSync, constants, promises as fsp, openSync, writeSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { errnoCode } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { loadConfig } from '../../../src/config/load.js';
import { decodeProtoJson } from '../../../src/cri/protojson.js';
import type { ContainerConfig__Output } from '../../../src/generated/runtime/v1/ContainerConfig.js';
import type { PodSandboxConfig__Output } from '../../../src/generated/runtime/v1/PodSandboxConfig.js';
import { GUEST_SHARED_DIR } from '../../../src/hypervisor/argv.js';
import { readPcieHostFacts } from '../../../src/pcie/index.js';
import { ContainerManager } from '../../../src/runtime/container/manager.js';
import { CONTAINER_RECORD_KIND, type ContainerRecord } from '../../../src/runtime/container/record.js';
import type { RequestContext } from '../../../src/runtime/context.js';
import { gatherFacts } from '../../../src/runtime/gather-facts.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { sandboxSharedDir, sandboxVmRoot } from '../../../src/runtime/sandbox/paths.js';
import { SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import { decodeContainerSpec } from '../../../src/runtime/spec/container.js';
import { decodeSandboxSpec } from '../../../src/runtime/spec/sandbox.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const logger = silentLogger();

function ctx(method: string): RequestContext {
  return { method, logger, signal: new AbortController().signal, deadlineMs: undefined, annotate: () => {} };
}

/** A read end as containerd's: opened before Create, non-blocking, everything collected until the end. */
class FifoReader {
  private readonly chunks: Buffer[] = [];
  readonly ended: Promise<void>;
  private readonly socket: net.Socket;

  constructor(p: string) {
    this.socket = new net.Socket({ fd: openSync(p, constants.O_RDONLY | constants.O_NONBLOCK), readable: true, writable: false });
    this.socket.on('data', (d: Buffer) => this.chunks.push(d));
    this.ended = new Promise((resolve) => this.socket.on('end', resolve));
  }

  get text(): string {
    return Buffer.concat(this.chunks).toString('latin1');
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** containerd's stdin writer: its open completes once the shim has the read end open. */
async function openStdinWriter(p: string, timeoutMs: number): Promise<number> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      return openSync(p, constants.O_WRONLY | constants.O_NONBLOCK);
    } catch (err) {
      if (errnoCode(err) !== 'ENXIO' || Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** A busybox root filesystem in a directory of the test's own, plus a file that must survive. */
async function busyboxRootfs(dir: string): Promise<string> {
  const rootfs = path.join(dir, 'bundle', 'rootfs');
  await fsp.mkdir(path.join(rootfs, 'bin'), { recursive: true });
  for (const d of ['etc', 'proc', 'sys', 'dev', 'tmp', 'keep']) await fsp.mkdir(path.join(rootfs, d), { recursive: true });
  await fsp.copyFile('/bin/busybox', path.join(rootfs, 'bin', 'busybox'));
  await fsp.chmod(path.join(rootfs, 'bin', 'busybox'), 0o755);
  for (const applet of ['sh', 'cat', 'echo', 'sleep', 'printf']) await fsp.symlink('busybox', path.join(rootfs, 'bin', applet));
  await fsp.writeFile(path.join(rootfs, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
  await fsp.writeFile(path.join(rootfs, 'keep', 'tripwire'), 'the caller owns this');
  return rootfs;
}

async function tree(root: string): Promise<string[]> {
  return (await fsp.readdir(root, { recursive: true })).map(String).sort();
}

describe('create with a caller id, rootfs and FIFO stdio, in a real pod VM', () => {
  let rt: TestRuntime;
  let sandboxes: SandboxManager;
  let containers: ContainerManager;
  let sandboxId: string;
  let rootfs: string;
  let rootfsBefore: string[];

  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime({}, { tmpPrefix: 'kto-' });
    const loaded = await loadConfig(rt.configPath);
    const { config } = loaded;
    const facts = await gatherFacts(loaded);
    const driverOptions = { cgroupRoot: config.cgroupRoot, dbusAddress: config.dbusAddress, logger };
    const cgroups = createCgroupDriver(facts.cgroupDriver.name, driverOptions);
    const host = { cpus: Math.max(1, os.cpus().length), memoryMiB: Math.floor(os.totalmem() / (1024 * 1024)) };
    const readPcieFacts = () => readPcieHostFacts(config.pcie);
    sandboxes = new SandboxManager({
      config,
      facts,
      logger,
      metrics: new RuntimeMetrics(),
      cgroups,
      store: new RecordStore<SandboxRecord>(config.stateDir, SANDBOX_RECORD_KIND, logger),
      host,
      readPcieFacts,
      cgroupDriverNamed: (name) => createCgroupDriver(name, driverOptions),
      listener: {
        sandboxStopping: (id, deadlineMs) => containers.sandboxStopping(id, deadlineMs),
        sandboxStopped: (id) => containers.sandboxStopped(id),
        sandboxRemoving: (id) => containers.sandboxRemoving(id),
      },
    });
    containers = new ContainerManager({
      config,
      logger,
      store: new RecordStore<ContainerRecord>(config.stateDir, CONTAINER_RECORD_KIND, logger),
      sandboxes,
      // The caller's root filesystem needs no image: any lookup is a failure of the test.
      images: {
        resolveImage: () => {
          throw new Error('no image is looked up for a caller rootfs');
        },
        rootfsSourceFor: () => {
          throw new Error('no image is copied for a caller rootfs');
        },
        imageConfig: async () => {
          throw new Error('no image config is read for a caller rootfs');
        },
      },
      host,
      readPcieFacts,
      guests: {
        agentOf: (id) => {
          const live = sandboxes.find(id);
          return live?.vm !== undefined ? live.agent : undefined;
        },
        sharedDirOf: (id) => sandboxSharedDir(config.stateDir, id),
        sharedDirsRoot: sandboxVmRoot(config.stateDir),
        guestSharedDir: GUEST_SHARED_DIR,
        guestPodOf: (id) => sandboxes.find(id)?.record.guestPod ?? null,
      },
    });
    await sandboxes.recover();
    await containers.recover();
    const pod = decodeProtoJson<PodSandboxConfig__Output>('runtime.v1.PodSandboxConfig', podConfig(rt, 'shim-options'));
    sandboxId = await sandboxes.run(decodeSandboxSpec(pod), 'kata-ts', ctx('RunPodSandbox'));
    rootfs = await busyboxRootfs(rt.dir);
    rootfsBefore = await tree(rootfs);
  });

  afterAll(async () => {
    if (sandboxes !== undefined && sandboxId !== undefined) {
      await sandboxes.stop(sandboxId, ctx('StopPodSandbox')).catch(() => undefined);
      await sandboxes.remove(sandboxId, ctx('RemovePodSandbox')).catch(() => undefined);
    }
    await containers?.close();
    sandboxes?.close();
    await rt?.cleanup();
  });

  function fifos(name: string): { stdin: string; stdout: string; stderr: string } {
    const dir = path.join(rt.dir, 'io', name);
    execFileSync('mkdir', ['-p', dir]);
    const out = { stdin: path.join(dir, 'stdin'), stdout: path.join(dir, 'stdout'), stderr: path.join(dir, 'stderr') };
    for (const p of Object.values(out)) execFileSync('mkfifo', [p]);
    return out;
  }

  function spec(name: string, command: string[]) {
    return decodeContainerSpec(
      decodeProtoJson<ContainerConfig__Output>('runtime.v1.ContainerConfig', {
        metadata: { name },
        image: { image: 'docker.io/library/busybox:latest' },
        command,
        stdin: true,
      }),
    );
  }

  it('raw bytes out of the FIFOs, stdin into cat until the writer closes, the exit code, and the rootfs untouched after remove', async () => {
    const io = fifos('cat');
    const stdout = new FifoReader(io.stdout);
    const stderr = new FifoReader(io.stderr);
    const script = 'printf "out\\001\\377\\n"; echo err >&2; cat; echo after-eof; exit 7';
    const id = await containers.create(sandboxId, spec('cat', ['/bin/sh', '-c', script]), ctx('Create'), {
      id: 'shim-task.cat_1',
      rootfs,
      stdio: { kind: 'fifo', ...io, terminal: false },
    });
    expect(id).toBe('shim-task.cat_1');
    await containers.start(id, ctx('Start'));
    expect(containers.resolve(id).pid).toBeGreaterThan(0);

    const writer = await openStdinWriter(io.stdin, scaledMs(30_000));
    writeSync(writer, 'piped through cat\n');
    closeSync(writer);

    const exit = await containers.waitExit(id, AbortSignal.timeout(scaledMs(60_000)));
    expect(exit.exitCode).toBe(7);
    expect(BigInt(exit.finishedAtNs)).toBeGreaterThan(0n);
    await Promise.all([stdout.ended, stderr.ended]);
    expect(stdout.text).toBe('out\u0001\u00ff\npiped through cat\nafter-eof\n');
    expect(stderr.text).toBe('err\n');

    await containers.remove(id, ctx('Remove'));
    expect(() => containers.resolve(id)).toThrow();
    expect(await tree(rootfs)).toEqual(rootfsBefore);
    expect(await fsp.readFile(path.join(rootfs, 'keep', 'tripwire'), 'utf8')).toBe('the caller owns this');
    const shared = path.join(sandboxSharedDir(rt.stateDir, sandboxId), 'containers');
    expect(await fsp.readdir(shared).catch(() => [])).toEqual([]);
  });

  it('kill signals a running container (SIGKILL: 137 from waitExit); killing it again is NOT_FOUND', async () => {
    const io = fifos('sleep');
    const stdout = new FifoReader(io.stdout);
    const id = await containers.create(sandboxId, spec('sleep', ['/bin/sh', '-c', 'echo ready; exec sleep 1000']), ctx('Create'), {
      id: 'shim-task.sleep',
      rootfs,
      stdio: { kind: 'fifo', stdin: '', stdout: io.stdout, stderr: io.stderr, terminal: false },
    });
    await containers.start(id, ctx('Start'));
    const deadline = Date.now() + scaledMs(30_000);
    while (!stdout.text.includes('ready') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    await containers.kill(id, 9, false, ctx('Kill'));
    expect((await containers.waitExit(id, AbortSignal.timeout(scaledMs(60_000)))).exitCode).toBe(137);
    await expect(containers.kill(id, 9, false, ctx('Kill'))).rejects.toMatchObject({
      kind: 'not_found',
      reason: 'CONTAINER_PROCESS_FINISHED',
    });
    await stdout.ended;
    await containers.remove(id, ctx('Remove'));
    expect(await tree(rootfs)).toEqual(rootfsBefore);
  });
});
