/**
 * Guest layout: where node, crun and the agent live decides how long a pod VM takes to boot to a
 * running agent under TCG, and how much memory each VM pays for them. Two guests built from the
 * same files by scripts/build-guest.sh (with the stub agent, test/fixtures/guest-agent-stub.ts):
 *
 *   image      the initramfs stays small; /usr is the read-only erofs guest.img on virtio-blk
 *   initramfs  the same /usr inside the initramfs (unpacked into guest RAM at every boot)
 *
 * booted alternately with the runtime's argv shape (paused start, QMP `cont`, the agent port),
 * timed from `cont` to the guest's KATA_TS_READY line and to the agent's first line on its port.
 * Reported side by side with the ratio of medians (image / initramfs), plus node's start-up in the
 * guest (guest clock, from init launching it to its first statement), the guest's memory in use
 * (MemTotal - MemAvailable) and QEMU's resident memory on the host when the agent reports.
 * Nothing is asserted.
 *
 *   node --import tsx bench/guest-boot.ts [--rounds N] [--json]
 */
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { chooseAcceleration } from '../src/hypervisor/accel.js';
import { buildQemuArgv } from '../src/hypervisor/argv.js';
import { startVm, vmPaths } from '../src/hypervisor/launcher.js';
import { ensureStubGuest, type GuestLayout, StubAgentConnection, type StubGuest } from '../test/helpers/guest-image.js';
import { QemuTracker } from '../test/helpers/hypervisor-guest.js';
import { median, readVmRssKiB } from './lib/proc.js';

const LAYOUTS: GuestLayout[] = ['image', 'initramfs'];
const MEMORY_MIB = 512;
const TIMEOUT_MS = 180_000;

interface Sample {
  layout: GuestLayout;
  readyMs: number;
  agentMs: number;
  nodeStartupMs: number;
  guestUsedKiB: number;
  qemuRssKiB: number;
}

async function bootOnce(layout: GuestLayout, guest: StubGuest, tracker: QemuTracker): Promise<Sample> {
  const workDir = tracker.workDir();
  const paths = { ...vmPaths(workDir), agentSocket: path.join(workDir, 'agent.sock') };
  const argv = buildQemuArgv({
    name: `kata-ts-bench-${layout}`,
    shape: { vcpus: 1, maxVcpus: 5, memoryMiB: MEMORY_MIB, maxMemoryMiB: MEMORY_MIB + 4096, hugepages: [], kernelParams: [] },
    accel: chooseAcceleration('auto').accel,
    kernelPath: guest.kernelPath,
    initrdPath: guest.initrdPath,
    ...(guest.guestImagePath === undefined ? {} : { guestImagePath: guest.guestImagePath }),
    kernelParams: [],
    paths,
    pcieArgs: [],
    confidential: false,
  });
  const vm = tracker.track(await startVm({ qemuBinary: 'qemu-system-x86_64', argv, workDir, paths, logger: silentLogger() }));
  const agent = await StubAgentConnection.connect(paths.agentSocket);
  try {
    const t0 = performance.now();
    await vm.resume();
    const ready = vm.waitForReady(TIMEOUT_MS).then(() => performance.now() - t0);
    const hello = await agent.next(TIMEOUT_MS);
    const agentMs = performance.now() - t0;
    const qemuRssKiB = readVmRssKiB(vm.pid) ?? Number.NaN;
    const readyMs = await ready;
    const mem = hello.meminfoKiB as Record<string, number>;
    return {
      layout,
      readyMs,
      agentMs,
      nodeStartupMs: ((hello.uptimeAtStartS as number) - (hello.launchedAtS as number)) * 1000,
      guestUsedKiB: (mem.MemTotal ?? 0) - (mem.MemAvailable ?? 0),
      qemuRssKiB,
    };
  } finally {
    agent.close();
    await vm.kill();
  }
}

export async function runGuestBootBench(rounds: number, progress: (line: string) => void): Promise<Record<string, unknown>> {
  const guests = new Map(LAYOUTS.map((layout) => [layout, ensureStubGuest(layout)] as const));
  const tracker = new QemuTracker();
  const samples: Sample[] = [];
  // startVm unrefs QEMU's child handle (the daemon must not wait for its VMs): once QEMU is killed
  // and its sockets close, nothing else would keep this process alive until the exit is seen.
  const keepAlive = setInterval(() => undefined, 1_000);
  try {
    for (let round = 0; round < rounds; round++) {
      // Alternate which layout goes first so that machine noise hits both alike.
      const order = round % 2 === 0 ? LAYOUTS : [...LAYOUTS].reverse();
      for (const layout of order) {
        const sample = await bootOnce(layout, guests.get(layout)!, tracker);
        samples.push(sample);
        progress(
          `round ${round + 1} ${layout.padEnd(9)} ready ${sample.readyMs.toFixed(0)} ms, agent ${sample.agentMs.toFixed(0)} ms, node start-up ${sample.nodeStartupMs.toFixed(0)} ms, guest used ${Math.round(sample.guestUsedKiB / 1024)} MiB, QEMU RSS ${Math.round(sample.qemuRssKiB / 1024)} MiB`,
        );
        await tracker.cleanup();
      }
    }
  } finally {
    await tracker.cleanup();
    clearInterval(keepAlive);
  }
  const summary: Record<string, Record<string, number>> = {};
  for (const layout of LAYOUTS) {
    const of = samples.filter((s) => s.layout === layout);
    summary[layout] = {
      readyMs: median(of.map((s) => s.readyMs)),
      agentMs: median(of.map((s) => s.agentMs)),
      nodeStartupMs: median(of.map((s) => s.nodeStartupMs)),
      guestUsedMiB: median(of.map((s) => s.guestUsedKiB / 1024)),
      qemuRssMiB: median(of.map((s) => s.qemuRssKiB / 1024)),
    };
  }
  const ratio = summary.image!.agentMs! / summary.initramfs!.agentMs!;
  return {
    bench: 'guest-boot',
    date: new Date().toISOString(),
    rounds,
    memoryMiB: MEMORY_MIB,
    summary,
    agentRatioImageOverInitramfs: ratio,
  };
}

function format(result: Record<string, unknown>): string {
  const summary = result.summary as Record<string, Record<string, number>>;
  const row = (name: string, key: string, unit: string): string =>
    `${name.padEnd(28)}${LAYOUTS.map((l) => `${summary[l]![key]!.toFixed(0)} ${unit}`.padStart(14)).join('')}`;
  return [
    `guest layout, medians of ${result.rounds} boots each (${result.memoryMiB} MiB VM, cont -> signal):`,
    `${''.padEnd(28)}${LAYOUTS.map((l) => l.padStart(14)).join('')}`,
    row('boot to KATA_TS_READY', 'readyMs', 'ms'),
    row('boot to agent started', 'agentMs', 'ms'),
    row('node start-up in guest', 'nodeStartupMs', 'ms'),
    row('guest memory in use', 'guestUsedMiB', 'MiB'),
    row('QEMU RSS at agent start', 'qemuRssMiB', 'MiB'),
    `boot to agent, image / initramfs: ${(result.agentRatioImageOverInitramfs as number).toFixed(2)}x`,
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({ options: { rounds: { type: 'string', default: '3' }, json: { type: 'boolean' } } });
  const result = await runGuestBootBench(Number(values.rounds), (line) => console.error(line));
  console.log(values.json === true ? JSON.stringify(result) : format(result));
}
