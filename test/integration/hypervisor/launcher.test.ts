import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { chooseAcceleration } from '../../../src/hypervisor/accel.js';
import { buildQemuArgv } from '../../../src/hypervisor/argv.js';
import { attachVm, startVm, type VmProcess, vmPaths } from '../../../src/hypervisor/launcher.js';
import { plugVcpus, setVirtioMemSize, virtioMemPluggedMiB } from '../../../src/hypervisor/resize.js';
import type { VmShape } from '../../../src/sizing/types.js';
import { ensureGuestAssets, type GuestAssets, processesMentioning, QemuTracker } from '../../helpers/hypervisor-guest.js';
import { rejection } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;
const run = promisify(execFile);
const logger = silentLogger();
const tracker = new QemuTracker();
let assets: GuestAssets;

beforeAll(async () => {
  assets = await ensureGuestAssets();
});
afterEach(async () => {
  await tracker.cleanup();
});

function shape(overrides: Partial<VmShape> = {}): VmShape {
  return { vcpus: 2, maxVcpus: 4, memoryMiB: 512, maxMemoryMiB: 1536, hugepages: [], kernelParams: [], ...overrides };
}

function argvFor(workDir: string, vmShape: VmShape, extra: string[] = []): string[] {
  const paths = vmPaths(workDir);
  return [
    ...buildQemuArgv({
      name: 'kata-ts-test',
      shape: vmShape,
      accel: chooseAcceleration('auto').accel,
      kernelPath: assets.kernelPath,
      initrdPath: assets.initrdPath,
      kernelParams: [],
      paths,
      // One PCIe root port as src/pcie would plan it, to prove the slot agreement holds in QEMU.
      pcieArgs: ['-device', 'pcie-root-port,id=rp0,bus=pcie.0,addr=08.0,chassis=1,slot=1,port=1,io-reserve=0'],
      confidential: false,
    }),
    ...extra,
  ];
}

async function start(vmShape = shape(), extra: string[] = []): Promise<{ vm: VmProcess; workDir: string }> {
  const workDir = tracker.workDir();
  const vm = await startVm({ qemuBinary: 'qemu-system-x86_64', argv: argvFor(workDir, vmShape, extra), workDir, logger });
  tracker.track(vm);
  return { vm, workDir };
}

describe('startVm with the real guest under QEMU (one boot)', () => {
  it('starts paused, boots to ready with the planned size, hot-plugs a vCPU, grows and shrinks virtio-mem, hot-plugs a PCIe device, powers off gracefully', async () => {
    const { vm } = await start();
    expect(await vm.qmp.queryStatus()).toMatchObject({ status: 'prelaunch', running: false });
    expect(vm.guestReport).toBeUndefined();

    await vm.resume();
    const ready = await vm.waitForReady(120_000);
    expect(ready.kind).toBe('ready');
    expect(ready.vcpus).toBe(2);
    expect(ready.onlineMemoryKiB).toBe(512 * 1024);
    expect(ready.memoryKiB).toBeLessThanOrEqual(512 * 1024);
    expect(ready.memoryKiB).toBeGreaterThan(256 * 1024);

    // QMP agrees with the guest.
    expect(await vm.qmp.queryCpusFast()).toHaveLength(2);
    expect(await vm.qmp.queryMemorySizeSummary()).toEqual({ 'base-memory': 512 * MiB, 'plugged-memory': 0 });

    // CPU hot-plug into the first free slot; the guest init onlines it.
    expect(await vm.qmp.queryHotpluggableCpus()).toHaveLength(4);
    expect(await plugVcpus(vm.qmp, 1)).toEqual(['vcpu-s0-c2-t0']);
    expect(await vm.qmp.queryCpusFast()).toHaveLength(3);

    // virtio-mem growth by 256 MiB, seen by QMP and by the guest.
    await setVirtioMemSize(vm.qmp, 256, 1024);
    const grown = await vm.waitForGuestReport((r) => r.vcpus === 3 && r.onlineMemoryKiB === 768 * 1024, 60_000);
    expect(grown.kind).toBe('update');
    expect(grown.memoryKiB).toBeGreaterThan(ready.memoryKiB + 200 * 1024);
    expect(await vm.qmp.queryMemorySizeSummary()).toEqual({ 'base-memory': 512 * MiB, 'plugged-memory': 256 * MiB });
    expect(await virtioMemPluggedMiB(vm.qmp)).toBe(256);

    // ... and shrinking back: the movable memory is unplugged by the guest.
    await setVirtioMemSize(vm.qmp, 0, 1024);
    const shrunk = await vm.waitForGuestReport((r) => r.onlineMemoryKiB === 512 * 1024, 60_000);
    expect(shrunk.memoryKiB).toBeLessThan(grown.memoryKiB);
    expect(await virtioMemPluggedMiB(vm.qmp)).toBe(0);

    // PCIe hot-plug onto the planned root port and removal with the guest's cooperation
    // (what CreateContainer/RemoveContainer do with VFIO devices; an emulated NIC stands in here).
    await vm.qmp.deviceAdd({ driver: 'virtio-net-pci', id: 'hotnet0', bus: 'rp0', addr: '00.0' });
    const underPort = async (): Promise<string[]> => {
      const bus0 = (await vm.qmp.queryPci())[0]!;
      const port = bus0.devices.find((d) => d.qdev_id === 'rp0');
      return (port?.pci_bridge?.devices ?? []).map((d) => d.qdev_id);
    };
    expect(await underPort()).toEqual(['hotnet0']);
    const deleted = await vm.qmp.deviceDelAndWait('hotnet0', 60_000);
    expect(deleted.data?.device).toBe('hotnet0');
    expect(await underPort()).toEqual([]);

    const result = await vm.shutdown({ timeoutMs: 30_000 });
    expect(result.how).toBe('powerdown');
    expect(result.exit).toEqual({ code: 0, signal: null, shutdownReason: 'guest-shutdown' });
    expect(isSameLiveProcess(vm.pid, vm.startTimeTicks)).toBe(false);
    expect(await vm.consoleTail(50)).toContain('power button pressed');
    // Idempotent.
    expect((await vm.shutdown({ timeoutMs: 1000 })).how).toBe('powerdown');
  });
});

describe('startVm and attachVm without booting (QEMU stays paused)', () => {
  it('rejects a QEMU that exits at start with its log tail, leaving no process', async () => {
    const workDir = tracker.workDir();
    const argv = argvFor(workDir, shape(), ['-device', 'no-such-device-model']);
    const err = await rejection(startVm({ qemuBinary: 'qemu-system-x86_64', argv, workDir, logger }));
    expect(err).toMatchObject({ kind: 'internal', reason: 'QEMU_EXITED_AT_START' });
    expect(err.message).toContain("'no-such-device-model' is not a valid device model name");
    expect(err.details?.code).toBe(1);
    expect(processesMentioning(workDir)).toEqual([]);
  });

  it("a jail the jailer cannot pivot into: the start fails with the jailer's own words, placed first, and leaves no process", async () => {
    // Not a mount point: pivot_root(2) refuses it (EINVAL). No identity is leased: the uid is the test's choice.
    const workDir = tracker.workDir();
    const jailDir = path.join(workDir, 'not-a-mount');
    await mkdir(jailDir);
    const placed: number[] = [];
    const err = await rejection(
      startVm({
        qemuBinary: 'qemu-system-x86_64',
        argv: argvFor(workDir, shape()),
        workDir,
        logger,
        jail: { jailDir, identity: { uid: 2_000_999_999, gid: 2_000_999_999 } },
        place: async (pid) => void placed.push(pid),
      }),
    );
    expect(err).toMatchObject({ kind: 'internal', reason: 'QEMU_EXITED_AT_START' });
    expect(err.message).toContain('kata-ts-jailer: pivot_root into');
    expect(err.details?.code).toBe(125);
    expect(placed).toHaveLength(1);
    expect(readProcStat(placed[0]!)).toBeUndefined();
    expect(processesMentioning(workDir)).toEqual([]);
  });

  it('a placement that fails ends the jailer before anything of QEMU ran, and the start fails with that error', async () => {
    const workDir = tracker.workDir();
    let placedPid = 0;
    const err = await startVm({
      qemuBinary: 'qemu-system-x86_64',
      argv: argvFor(workDir, shape()),
      workDir,
      logger,
      jail: { jailDir: '/nonexistent-jail', identity: { uid: 2_000_999_999, gid: 2_000_999_999 } },
      place: async (pid) => {
        placedPid = pid;
        throw new Error('no cgroup for you');
      },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe('no cgroup for you');
    expect(readProcStat(placedPid)).toBeUndefined();
    expect(processesMentioning(workDir)).toEqual([]);
  });

  it('rejects a missing QEMU binary', async () => {
    const workDir = tracker.workDir();
    const err = await rejection(
      startVm({ qemuBinary: '/nonexistent/qemu-system-x86_64', argv: argvFor(workDir, shape()), workDir, logger }),
    );
    // Started through `unshare --net` (never in the host's network namespace), which cannot exec it.
    expect(err).toMatchObject({ kind: 'internal', reason: 'QEMU_EXITED_AT_START' });
    expect(err.message).toContain('/nonexistent/qemu-system-x86_64: No such file or directory');
  });

  it('detects kill -9 of QEMU and reports the signal', async () => {
    const { vm } = await start();
    expect(vm.exitInfo).toBeUndefined();
    process.kill(vm.pid, 'SIGKILL');
    const exit = await vm.exited;
    expect(exit).toEqual({ code: null, signal: 'SIGKILL', shutdownReason: null });
    expect(vm.qmp.isClosed).toBe(true);
    expect(await rejection(vm.waitForReady(60_000))).toMatchObject({ kind: 'internal', reason: 'QEMU_EXITED' });
  });

  it('times out waiting for a guest that never signals ready, and stops a paused VM with quit', async () => {
    const { vm } = await start();
    // Never resumed: the guest cannot report.
    expect(await rejection(vm.waitForReady(200))).toMatchObject({ kind: 'timeout', reason: 'GUEST_READY_TIMEOUT' });
    const result = await vm.shutdown({ timeoutMs: 10_000 });
    expect(result.how).toBe('quit');
    expect(result.exit).toEqual({ code: 0, signal: null, shutdownReason: 'host-qmp-quit' });
  });

  it('re-attaches to a running QEMU after the original handle is released, and notices its death', async () => {
    const { vm, workDir } = await start();
    const paths = vmPaths(workDir);
    const { pid, startTimeTicks } = vm;
    vm.release();

    const wrongStart = await rejection(attachVm({ pid, startTimeTicks: startTimeTicks - 1, qmpSocket: paths.qmpSocket, logger }));
    expect(wrongStart).toMatchObject({ kind: 'not_found', reason: 'VM_PROCESS_GONE' });
    const wrongSocket = await rejection(attachVm({ pid, startTimeTicks, qmpSocket: '/tmp/other/qmp.sock', logger }));
    expect(wrongSocket).toMatchObject({ kind: 'precondition', reason: 'VM_PROCESS_MISMATCH' });

    const attached = await attachVm({
      pid,
      startTimeTicks,
      qmpSocket: paths.qmpSocket,
      readySocket: paths.readySocket,
      qemuLog: paths.qemuLog,
      logger,
    });
    tracker.track(attached);
    expect(attached.pid).toBe(pid);
    expect((await attached.qmp.queryStatus()).status).toBe('prelaunch');
    expect(await attached.qmp.queryCpusFast()).toHaveLength(2);

    process.kill(pid, 'SIGKILL');
    const exit = await attached.exited;
    expect(exit).toEqual({ code: null, signal: null, shutdownReason: null });
    expect(isSameLiveProcess(pid, startTimeTicks)).toBe(false);
    expect(await rejection(attachVm({ pid, startTimeTicks, qmpSocket: paths.qmpSocket, logger }))).toMatchObject({
      reason: 'VM_PROCESS_GONE',
    });
  });

  it('keeps QEMU running when the daemon that started it dies, and lets a new daemon attach', async () => {
    const workDir = tracker.workDir();
    const paths = vmPaths(workDir);
    const helper = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../helpers/hypervisor-start-detached.ts');
    const spec = JSON.stringify({ qemuBinary: 'qemu-system-x86_64', argv: argvFor(workDir, shape()), workDir });
    const { stdout } = await run(process.execPath, ['--import', 'tsx', helper, spec], { timeout: 60_000 });
    const started = tracker.track(JSON.parse(stdout) as { pid: number; startTimeTicks: number });
    // The "daemon" exited; its QEMU lives on in its own session.
    expect(isSameLiveProcess(started.pid, started.startTimeTicks)).toBe(true);
    expect(readProcStat(started.pid)?.state).not.toBe('Z');

    const attached = await attachVm({ ...started, qmpSocket: paths.qmpSocket, qemuLog: paths.qemuLog, logger });
    expect((await attached.qmp.queryStatus()).status).toBe('prelaunch');
    const result = await attached.shutdown({ timeoutMs: 10_000 });
    expect(result).toEqual({ how: 'quit', exit: { code: null, signal: null, shutdownReason: 'host-qmp-quit' } });
    expect(isSameLiveProcess(started.pid, started.startTimeTicks)).toBe(false);
  });

  it('removes a stale socket file before starting', async () => {
    const { vm, workDir } = await start();
    expect(existsSync(vmPaths(workDir).qmpSocket)).toBe(true);
    await vm.kill();
    // The dead QEMU left its socket files behind; a new start in the same directory must work.
    const again = tracker.track(await startVm({ qemuBinary: 'qemu-system-x86_64', argv: argvFor(workDir, shape()), workDir, logger }));
    expect((await again.qmp.queryStatus()).status).toBe('prelaunch');
    await again.kill();
  });
});
