/**
 * Security checks on a real sandbox (one boot): the CRI socket is 0660; the state, VM, work and
 * VMM directories are 0700 and every QMP, ready, agent and virtio-fs socket (in the VMM dir of
 * the confined QEMU) is 0600;
 * shell metacharacters in request fields reach no shell (nothing runs them) and no QEMU argv; a
 * log path or log directory leaving the pod's log directory is refused and changes nothing.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readCmdline } from '../../../src/hypervisor/index.js';
import { sandboxSharedDir, sandboxVmmDir, sandboxWorkDir } from '../../../src/runtime/sandbox/paths.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const mode = async (p: string): Promise<number> => (await fsp.stat(p)).mode & 0o777;

describe('security checks on a running sandbox', () => {
  let rt: TestRuntime;
  const marker = path.join(os.tmpdir(), `kts-pwned-${randomBytes(4).toString('hex')}`);
  let id = '';
  let config: Record<string, unknown> = {};
  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime();
    await rt.start();
    // Every free-text field a kubelet passes on carries a command substitution (names, namespace,
    // uid and hostname are held to their grammar: test/integration/cri/hostile-requests.test.ts).
    const evil = `$(touch ${marker})`;
    config = podConfig(rt, 'sec', {
      labels: { app: evil },
      annotations: { note: `; touch ${marker}` },
    });
    id = (await rt.cri.runtime.RunPodSandbox({ config })).pod_sandbox_id;
  }, scaledMs(180_000));
  afterAll(async () => {
    await rt?.cleanup();
    await fsp.rm(marker, { force: true });
  });

  it('the CRI socket is 0660; state, VM, work, VMM and shared dirs are 0700; every socket (in the VMM dir) is 0600', async () => {
    expect(await mode(rt.socketPath)).toBe(0o660);
    const workDir = sandboxWorkDir(rt.stateDir, id);
    // The default handler confines QEMU: its sockets are in its VMM dir, none in the work dir.
    const vmmDir = sandboxVmmDir(workDir);
    for (const dir of [rt.stateDir, path.dirname(workDir), workDir, vmmDir, sandboxSharedDir(rt.stateDir, id)]) {
      expect([dir, await mode(dir)]).toEqual([dir, 0o700]);
    }
    expect((await fsp.readdir(workDir, { withFileTypes: true })).filter((e) => e.isSocket())).toEqual([]);
    const sockets: Array<[string, number]> = [];
    for (const entry of await fsp.readdir(vmmDir, { withFileTypes: true })) {
      if (entry.isSocket()) sockets.push([entry.name, await mode(path.join(vmmDir, entry.name))]);
    }
    expect(sockets.map(([n]) => n).sort()).toEqual(['agent.sock', 'qmp.sock', 'ready.sock', 'vfs.sock']);
    for (const s of sockets) expect(s).toEqual([s[0], 0o600]);
  });

  it('request fields reached no shell and no QEMU argv', async () => {
    await expect(fsp.stat(marker)).rejects.toThrow();
    const res = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    const info = JSON.parse(res.info.info!) as { pid: number };
    const argv = readCmdline(info.pid).join(' ');
    expect(argv).toContain('qemu-system');
    expect(argv).not.toContain('touch');
  });

  it('a log path or log directory leaving the pod log directory is refused and changes nothing', async () => {
    const before = await rt.cri.runtime.ListContainers({});
    for (const logPath of ['../../escape.log', '/etc/cron.d/escape', 'a/../../../escape.log']) {
      await expectGrpcError(
        rt.cri.runtime.CreateContainer({
          pod_sandbox_id: id,
          config: { metadata: { name: 'c', attempt: 0 }, image: { image: 'busybox' }, log_path: logPath },
          sandbox_config: config,
        }),
        status.INVALID_ARGUMENT,
        'CONTAINER_LOG_PATH_INVALID',
      );
    }
    expect(await rt.cri.runtime.ListContainers({})).toEqual(before);
    const badDir = podConfig(rt, 'logdir', { log_directory: '/var/log/pods/../../../etc' });
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: badDir }), status.INVALID_ARGUMENT, 'SANDBOX_LOG_DIRECTORY_INVALID');
    const listed = await rt.cri.runtime.ListPodSandbox({});
    expect(listed.items.map((s) => s.id)).toEqual([id]);
  });
});
