/**
 * The per-pod server in this process: it holds the pod's state dir, serves what registerServices
 * registered on the pod's socket (UNIMPLEMENTED for the rest), stays while the pod holds tasks,
 * and on shutdown with no task left answers the call that asked, then removes its socket and the
 * pod's state dir. A stop by signal keeps the state for `delete`.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { scrapeMetricsSocket } from '../../../src/shim/node-pods.js';
import { readShimInfo } from '../../../src/shim/paths.js';
import { type ShimIdentity, type ShimServer, startShimServer } from '../../../src/shim/serve.js';
import { connectTtrpc } from '../../../src/ttrpc/index.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const dirs: string[] = [];
const servers: ShimServer[] = [];
afterAll(async () => {
  for (const s of servers) await s.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function setup(sandboxId: string): { identity: ShimIdentity; stateDir: string; root: string } {
  const root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shim-serve-'));
  dirs.push(root);
  const bundle = path.join(root, 'bundle');
  mkdirSync(bundle);
  writeFileSync(path.join(bundle, 'config.json'), JSON.stringify({ annotations: {}, linux: { cgroupsPath: '/kubepods/pod1/x' } }));
  return {
    root,
    stateDir: path.join(root, 'default', sandboxId),
    identity: {
      namespace: 'default',
      sandboxId,
      bundle,
      socketPath: path.join(root, 's', 'sock'),
      containerdAddress: '/run/containerd/containerd.sock',
      ttrpcAddress: '',
      publishBinary: '',
      debug: false,
      logger: silentLogger(),
    },
  };
}

describe('startShimServer', () => {
  it('serves the registered services, writes shim.json, and on shutdown with no task left removes the pod', async () => {
    const { identity, stateDir, root } = setup('pod-a');
    let shutdown: () => boolean = () => false;
    const shim = await startShimServer({
      loaded: { config: { ...defaultConfig(), shim: { stateRoot: root, mode: 'pod' as const } }, path: null },
      stateDir,
      identity,
      facts: testFacts(),
      registerServices: (server, pod, requestShutdown, who) => {
        expect(who.sandboxId).toBe('pod-a');
        expect(pod.stateDir).toBe(stateDir);
        shutdown = requestShutdown;
        server.register('kata.test.Shim', {
          Tasks: () => Buffer.from(String(pod.taskCount())),
          Shutdown: () => Buffer.from(String(shutdown())),
        });
      },
    });
    servers.push(shim);
    expect(statSync(path.dirname(identity.socketPath)).mode & 0o777).toBe(0o700);
    expect(statSync(identity.socketPath).mode & 0o777).toBe(0o600);
    expect(await readShimInfo(stateDir)).toMatchObject({
      pid: process.pid,
      sandboxId: 'pod-a',
      cgroupDriver: 'cgroupfs',
      socket: identity.socketPath,
    });
    const client = await connectTtrpc(identity.socketPath);
    try {
      expect((await client.call('kata.test.Shim', 'Tasks', new Uint8Array())).toString()).toBe('0');
      await expect(client.call('containerd.task.v2.Task', 'State', new Uint8Array())).rejects.toMatchObject({ code: 12 });
      // The call that asks is answered before the server goes.
      expect((await client.call('kata.test.Shim', 'Shutdown', new Uint8Array())).toString()).toBe('true');
    } finally {
      await client.close();
    }
    expect(await shim.done).toBe('shutdown');
    expect(existsSync(identity.socketPath)).toBe(false);
    expect(existsSync(stateDir)).toBe(false);
  });

  it('a stop (signal) keeps the pod state for delete; the state dir is held meanwhile', async () => {
    const { identity, stateDir, root } = setup('pod-b');
    const options = {
      loaded: { config: { ...defaultConfig(), shim: { stateRoot: root, mode: 'pod' as const } }, path: null },
      stateDir,
      identity,
      facts: testFacts(),
      registerServices: () => undefined,
    };
    const shim = await startShimServer(options);
    servers.push(shim);
    // The pod's metrics socket answers while it serves (no sandbox yet: the shim's own process).
    const metricsSocket = path.join(stateDir, 'metrics.sock');
    expect(statSync(metricsSocket).mode & 0o777).toBe(0o600);
    expect(await scrapeMetricsSocket(metricsSocket, 5_000)).toMatch(
      /^kata_ts_shim_process_up\{sandbox_id="pod-b",namespace="[^"]+",handler="kata-ts",process="shim"\} 1$/m,
    );
    // A second shim for the same pod is refused before it changes anything.
    await expect(startShimServer(options)).rejects.toMatchObject({ reason: 'STATE_DIR_LOCKED' });
    expect(existsSync(metricsSocket)).toBe(true);
    expect(await shim.stop()).toBe('signal');
    expect(existsSync(identity.socketPath)).toBe(false);
    expect(existsSync(metricsSocket)).toBe(false);
    expect(await readShimInfo(stateDir)).toMatchObject({ sandboxId: 'pod-b' });
    expect(existsSync(path.join(stateDir, 'daemon.lock'))).toBe(false);
  });

  it("refuses a state dir that another sandbox's shim.json names (ids sharing 16 characters)", async () => {
    const { identity, stateDir, root } = setup('pod-c');
    const loaded = { config: { ...defaultConfig(), shim: { stateRoot: root, mode: 'pod' as const } }, path: null };
    const first = await startShimServer({ loaded, stateDir, identity, facts: testFacts(), registerServices: () => undefined });
    await first.stop();
    await expect(
      startShimServer({
        loaded,
        stateDir,
        identity: { ...identity, sandboxId: 'pod-c-other' },
        facts: testFacts(),
        registerServices: () => undefined,
      }),
    ).rejects.toMatchObject({ reason: 'SHIM_POD_DIR_TAKEN' });
    expect(existsSync(path.join(stateDir, 'daemon.lock'))).toBe(false);
  });
});
