import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { isSameLiveProcess } from '../../../src/common/procfs.js';
import { chooseAcceleration } from '../../../src/hypervisor/accel.js';
import { buildQemuArgv, GUEST_SHARED_DIR } from '../../../src/hypervisor/argv.js';
import { startVm, vmPaths } from '../../../src/hypervisor/launcher.js';
import { startVirtiofsd, type VirtiofsdProcess } from '../../../src/hypervisor/virtiofsd.js';
import { ensureStubGuest, StubAgentConnection, type StubGuest } from '../../helpers/guest-image.js';
import { QemuTracker } from '../../helpers/hypervisor-guest.js';
import { scaledMs } from '../../helpers/time-scale.js';

const logger = silentLogger();
const tracker = new QemuTracker();
const cleanups: Array<() => Promise<void> | void> = [];
let guest: StubGuest;

interface Mount {
  source: string;
  target: string;
  type: string;
  options: string;
}

beforeAll(() => {
  guest = ensureStubGuest('image');
}, scaledMs(300_000));
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  await tracker.cleanup();
});

describe('the guest image under real QEMU (one boot)', () => {
  it('mounts the image at /usr, runs the agent with node, shares a host directory over virtio-fs, runs crun, mounts cgroup2 only, restarts the agent, powers off', async () => {
    const workDir = tracker.workDir();
    const shared = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-shared-'));
    cleanups.push(() => rmSync(shared, { recursive: true, force: true }));
    writeFileSync(path.join(shared, 'hello.txt'), 'written by the host\n');

    const paths = {
      ...vmPaths(workDir),
      agentSocket: path.join(workDir, 'agent.sock'),
      virtiofsSocket: path.join(workDir, 'virtiofsd.sock'),
    };
    const virtiofsd: VirtiofsdProcess = await startVirtiofsd({
      socketPath: paths.virtiofsSocket,
      sourceDir: shared,
      logFile: path.join(workDir, 'virtiofsd.log'),
      logger,
    });
    cleanups.push(() => virtiofsd.stop(1_000));

    const argv = buildQemuArgv({
      name: 'kata-ts-guest-image-test',
      shape: { vcpus: 2, maxVcpus: 3, memoryMiB: 512, maxMemoryMiB: 768, hugepages: [], kernelParams: [] },
      accel: chooseAcceleration('auto').accel,
      kernelPath: guest.kernelPath,
      initrdPath: guest.initrdPath,
      ...(guest.guestImagePath === undefined ? {} : { guestImagePath: guest.guestImagePath }),
      kernelParams: [],
      paths,
      pcieArgs: [],
      confidential: false,
    });
    const vm = tracker.track(await startVm({ qemuBinary: 'qemu-system-x86_64', argv, workDir, paths, logger }));
    const agent = await StubAgentConnection.connect(paths.agentSocket);
    cleanups.push(() => agent.close());
    await vm.resume();

    // The ready protocol of guest/init is unchanged.
    expect((await vm.waitForReady(120_000)).kind).toBe('ready');
    const hello = await agent.next(120_000).catch(async (err: unknown) => {
      throw new Error(`${String(err)}\nconsole:\n${await vm.consoleTail(40)}`);
    });
    expect(hello).toMatchObject({ kind: 'hello', start: 1, node: process.version });

    const mounts = hello.mounts as Mount[];
    const at = (target: string): Mount | undefined => mounts.find((m) => m.target === target);
    expect(at('/usr')).toMatchObject({ type: 'erofs' });
    expect(at('/usr')?.options.split(',')).toContain('ro');
    expect(at(GUEST_SHARED_DIR)).toMatchObject({ type: 'virtiofs', source: 'kata-ts-shared' });
    // cgroup2 alone: no v1 hierarchy anywhere (crun refuses hybrid layouts).
    expect(at('/sys/fs/cgroup')).toMatchObject({ type: 'cgroup2' });
    expect(mounts.filter((m) => m.type === 'cgroup')).toEqual([]);
    expect(String(hello.cgroupSubtreeControl).split(' ')).toEqual(expect.arrayContaining(['cpu', 'memory', 'pids', 'io']));

    // Host -> guest and guest -> host through virtio-fs.
    expect(hello.sharedHello).toBe('written by the host\n');
    agent.send('write from-guest.txt');
    expect(await agent.next(30_000)).toEqual({ kind: 'written', name: 'from-guest.txt' });
    expect(readFileSync(path.join(shared, 'from-guest.txt'), 'utf8')).toBe('written by the guest agent stub\n');

    // crun from the image, with its libraries.
    expect(hello.crun).toMatchObject({ status: 0, error: null });
    expect((hello.crun as { stdout: string }).stdout).toMatch(/^crun version \d+\.\d+/);

    // guest/init restarts an agent that exits.
    agent.send('exit 3');
    expect(await agent.next(120_000)).toMatchObject({ kind: 'hello', start: 2 });
    expect(await vm.consoleTail(200)).toContain('the agent exited with status 3');

    const result = await vm.shutdown({ timeoutMs: 60_000 });
    expect(result.exit).toEqual({ code: 0, signal: null, shutdownReason: 'guest-shutdown' });
    // virtiofsd ends by itself when QEMU, its only client, is gone.
    for (let i = 0; i < 100 && isSameLiveProcess(virtiofsd.pid, virtiofsd.startTimeTicks); i++) await new Promise((r) => setTimeout(r, 50));
    expect(isSameLiveProcess(virtiofsd.pid, virtiofsd.startTimeTicks)).toBe(false);
    expect(existsSync(path.join(shared, 'hello.txt'))).toBe(true);
  });
});
