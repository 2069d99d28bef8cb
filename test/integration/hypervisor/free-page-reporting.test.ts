/**
 * Free page reporting under real QEMU (one boot of the stub-agent guest, test/fixtures/
 * guest-agent-stub.ts): with the virtio-balloon device of the argv builder (free-page-reporting=on)
 * and the guest's virtio_balloon module, memory the guest allocated and then freed goes back to
 * the host. The stub fills a tmpfs file in guest RAM, QEMU's RSS rises by about its size; the file
 * is removed, and QEMU's RSS must fall back by most of it. The wait follows QEMU's RSS while it
 * keeps moving (untilProgress), never a fixed sleep; the test's timeout is the overall cap.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { chooseAcceleration } from '../../../src/hypervisor/accel.js';
import { buildQemuArgv } from '../../../src/hypervisor/argv.js';
import { startVm, vmPaths } from '../../../src/hypervisor/launcher.js';
import { ensureStubGuest, StubAgentConnection, type StubGuest } from '../../helpers/guest-image.js';
import { QemuTracker } from '../../helpers/hypervisor-guest.js';
import { untilProgress } from '../../helpers/poll.js';
import { scaledMs } from '../../helpers/time-scale.js';

const tracker = new QemuTracker();
const cleanups: Array<() => void> = [];
let guest: StubGuest;
const FILL_MIB = 300;

function rssKiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1] ?? Number.NaN);
}

beforeAll(() => {
  guest = ensureStubGuest('image');
}, scaledMs(300_000));
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup();
  await tracker.cleanup();
});

describe('free page reporting (one boot)', () => {
  it('memory the guest fills and frees again goes back to the host: QEMU RSS rises by the fill, then falls', async () => {
    const workDir = tracker.workDir();
    const paths = { ...vmPaths(workDir), agentSocket: path.join(workDir, 'agent.sock') };
    const argv = buildQemuArgv({
      name: 'kata-ts-free-page-reporting-test',
      shape: { vcpus: 1, maxVcpus: 1, memoryMiB: 768, maxMemoryMiB: 768, hugepages: [], kernelParams: [] },
      accel: chooseAcceleration('auto').accel,
      kernelPath: guest.kernelPath,
      initrdPath: guest.initrdPath,
      ...(guest.guestImagePath === undefined ? {} : { guestImagePath: guest.guestImagePath }),
      kernelParams: [],
      paths,
      pcieArgs: [],
      confidential: false,
      tcgTranslationCacheMiB: 64,
      freePageReporting: true,
    });
    const vm = tracker.track(await startVm({ qemuBinary: 'qemu-system-x86_64', argv, workDir, paths, logger: silentLogger() }));
    const agent = await StubAgentConnection.connect(paths.agentSocket);
    cleanups.push(() => agent.close());
    await vm.resume();
    const hello = await agent.next(scaledMs(180_000)).catch(async (err: unknown) => {
      throw new Error(`${String(err)}\nconsole:\n${await vm.consoleTail(40)}`);
    });
    // The balloon device is bound to the guest's driver.
    expect(hello.balloonDriver).toEqual([expect.stringMatching(/^virtio\d+$/)]);
    // guest/init lowered the reporting order to single pages (the kernel's default is 9, 2 MiB).
    expect(hello.pageReportingOrder).toBe('0');

    const before = rssKiB(vm.pid);
    agent.send(`fill ${FILL_MIB}`);
    expect(await agent.next(scaledMs(180_000))).toMatchObject({ kind: 'filled', mib: FILL_MIB });
    const peak = rssKiB(vm.pid);
    // The fill is in guest RAM, so on the host: QEMU grew by most of it.
    expect(peak - before).toBeGreaterThan(FILL_MIB * 1024 * 0.8);

    agent.send('drop');
    expect(await agent.next(scaledMs(60_000))).toMatchObject({ kind: 'dropped' });
    // The guest reports the freed pages (batched), QEMU discards them: its RSS
    // falls by most of the fill. Waits as long as the RSS keeps moving.
    const fallen = await untilProgress(
      `QEMU RSS to fall below ${Math.round((peak - FILL_MIB * 1024 * 0.7) / 1024)} MiB after the guest freed ${FILL_MIB} MiB`,
      async () => {
        const now = rssKiB(vm.pid);
        return {
          done: now < peak - FILL_MIB * 1024 * 0.7 ? now : undefined,
          progress: Math.round(now / 1024),
          seen: `RSS ${Math.round(now / 1024)} MiB (before fill ${Math.round(before / 1024)}, peak ${Math.round(peak / 1024)})`,
        };
      },
      60_000,
      500,
    );
    expect(fallen).toBeLessThan(peak - FILL_MIB * 1024 * 0.7);
  }, 900_000);
});
