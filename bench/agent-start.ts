/**
 * The agent's start on the guest's clock: from guest/init exec'ing node (KATA_TS_AGENT_LAUNCHED_AT,
 * /proc/uptime) to the agent's port open and announced (its 'agent serving' log line carries
 * `readyAtS` from the same clock). Two or more guests with the real agent are booted alternately
 * with the same argv (the runtime's shape: 1 vCPU, 512 MiB, 4 GiB virtio-mem headroom, the guest
 * image, the agent port); per guest the medians of the guest-clock start, of the host's time from
 * QMP `cont` to the agent's first bytes on its port, and of QEMU's RSS then; the ratio of the
 * guest-clock medians against the first guest. Nothing is asserted.
 *
 *   node --import tsx bench/agent-start.ts [--rounds N] [--guest NAME=DIR ...] [--json]
 *
 * Without --guest: this tree's guest built twice by scripts/build-guest.sh, with the agent's
 * start-up snapshot off (`bundle`: node parses, compiles and evaluates agent.mjs) and on
 * (`snapshot`), into .cache/guest-agent-bundle and .cache/guest-agent. With --guest, any guest
 * directories (a guest built from an older commit, for a before/after), the first is the baseline.
 * The agent needs only to log its line: each guest must have an agent that logs `readyAtS`.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { chooseAcceleration } from '../src/hypervisor/accel.js';
import { buildQemuArgv } from '../src/hypervisor/argv.js';
import { startVm, vmPaths } from '../src/hypervisor/launcher.js';
import { type AgentServingEntry, agentServingEntry } from '../test/helpers/agent-guest.js';
import { QemuTracker } from '../test/helpers/hypervisor-guest.js';
import { median, readVmRssKiB, sleep } from './lib/proc.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const MEMORY_MIB = 512;
const TIMEOUT_MS = 240_000;

interface Guest {
  name: string;
  dir: string;
}

interface Sample {
  guest: string;
  /** Guest clock: init exec'ing node to the agent announcing on its port. */
  agentStartMs: number;
  /** Guest clock: of that, init exec'ing node to startAgent (node up, agent code loaded); NaN if not logged. */
  nodeAndLoadMs: number;
  /** Host clock: QMP cont to the agent's first bytes on its port. */
  contToAgentMs: number;
  qemuRssKiB: number;
}

/** The agent's 'agent serving' log line in the console log (pino JSON), once it is there. */
function servingLine(consoleLog: string): AgentServingEntry | undefined {
  let text: string;
  try {
    text = readFileSync(consoleLog, 'utf8');
  } catch {
    return undefined;
  }
  return agentServingEntry(text);
}

async function bootOnce(guest: Guest, tracker: QemuTracker): Promise<Sample> {
  const workDir = tracker.workDir();
  const paths = { ...vmPaths(workDir), agentSocket: path.join(workDir, 'agent.sock') };
  const argv = buildQemuArgv({
    name: `kata-ts-bench-agent-${guest.name}`,
    shape: { vcpus: 1, maxVcpus: 5, memoryMiB: MEMORY_MIB, maxMemoryMiB: MEMORY_MIB + 4096, hugepages: [], kernelParams: [] },
    accel: chooseAcceleration('auto').accel,
    kernelPath: path.join(guest.dir, 'vmlinuz'),
    initrdPath: path.join(guest.dir, 'initramfs.cpio.gz'),
    guestImagePath: path.join(guest.dir, 'guest.img'),
    kernelParams: [],
    paths,
    pcieArgs: [],
    confidential: false,
    tcgTranslationCacheMiB: 64,
  });
  const vm = tracker.track(await startVm({ qemuBinary: 'qemu-system-x86_64', argv, workDir, paths, logger: silentLogger() }));
  // A guest's write to the port blocks until a host end is connected: connect before cont.
  const socket = net.connect(paths.agentSocket);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.on('error', () => undefined);
  try {
    const firstBytes = new Promise<void>((resolve) => socket.once('data', () => resolve()));
    const t0 = performance.now();
    await vm.resume();
    const timeout = sleep(TIMEOUT_MS).then(() => {
      throw new Error(`no bytes from the agent within ${TIMEOUT_MS} ms`);
    });
    await Promise.race([firstBytes, timeout]);
    const contToAgentMs = performance.now() - t0;
    const qemuRssKiB = readVmRssKiB(vm.pid) ?? Number.NaN;
    // The line follows the announce at once; poll the console log for it (progress, not a deadline).
    const deadline = Date.now() + 60_000;
    let serving = servingLine(paths.consoleLog);
    while (serving === undefined) {
      if (Date.now() > deadline) throw new Error(`the agent announced but logged no 'agent serving' line in ${paths.consoleLog}`);
      await sleep(100);
      serving = servingLine(paths.consoleLog);
    }
    return {
      guest: guest.name,
      agentStartMs: (serving.readyAtS - serving.launchedAtS) * 1000,
      nodeAndLoadMs: ((serving.startedAtS ?? Number.NaN) - serving.launchedAtS) * 1000,
      contToAgentMs,
      qemuRssKiB,
    };
  } finally {
    socket.destroy();
    await vm.kill();
  }
}

/** This tree's guest with the real agent, snapshot off and on (build-guest.sh is idempotent). */
function defaultGuests(): Guest[] {
  const build = (dir: string, snapshot: 'on' | 'off'): void => {
    execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir, '--agent-snapshot', snapshot], {
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  };
  const bundle = path.join(repo, '.cache/guest-agent-bundle');
  const snapshot = path.join(repo, '.cache/guest-agent');
  build(bundle, 'off');
  build(snapshot, 'on');
  return [
    { name: 'bundle', dir: bundle },
    { name: 'snapshot', dir: snapshot },
  ];
}

export async function runAgentStartBench(
  rounds: number,
  guests: Guest[],
  progress: (line: string) => void,
): Promise<Record<string, unknown>> {
  const tracker = new QemuTracker();
  const samples: Sample[] = [];
  // startVm unrefs QEMU's child: keep this process alive until the last exit is seen.
  const keepAlive = setInterval(() => undefined, 1_000);
  try {
    for (let round = 0; round < rounds; round++) {
      // Alternate the order so that machine noise hits every guest alike.
      const order = round % 2 === 0 ? guests : [...guests].reverse();
      for (const guest of order) {
        const s = await bootOnce(guest, tracker);
        samples.push(s);
        progress(
          `round ${round + 1} ${guest.name.padEnd(10)} agent start (guest clock) ${s.agentStartMs.toFixed(0)} ms (node + code ${s.nodeAndLoadMs.toFixed(0)}), cont -> agent bytes ${s.contToAgentMs.toFixed(0)} ms, QEMU RSS ${Math.round(s.qemuRssKiB / 1024)} MiB`,
        );
        await tracker.cleanup();
      }
    }
  } finally {
    await tracker.cleanup();
    clearInterval(keepAlive);
  }
  const summary: Record<string, Record<string, number>> = {};
  for (const g of guests) {
    const of = samples.filter((s) => s.guest === g.name);
    summary[g.name] = {
      agentStartMs: median(of.map((s) => s.agentStartMs)),
      nodeAndLoadMs: median(of.map((s) => s.nodeAndLoadMs)),
      contToAgentMs: median(of.map((s) => s.contToAgentMs)),
      qemuRssMiB: median(of.map((s) => s.qemuRssKiB / 1024)),
    };
  }
  const base = summary[guests[0]!.name]!;
  const ratios = Object.fromEntries(
    guests.slice(1).map((g) => [
      `${g.name}/${guests[0]!.name}`,
      {
        agentStart: summary[g.name]!.agentStartMs! / base.agentStartMs!,
        contToAgent: summary[g.name]!.contToAgentMs! / base.contToAgentMs!,
      },
    ]),
  );
  return {
    bench: 'agent-start',
    date: new Date().toISOString(),
    rounds,
    memoryMiB: MEMORY_MIB,
    guests: guests.map((g) => ({ ...g, manifest: manifestOf(g.dir) })),
    samples,
    summary,
    ratios,
  };
}

function manifestOf(dir: string): Record<string, string> {
  try {
    const lines = readFileSync(path.join(dir, 'manifest'), 'utf8').split('\n');
    const wanted = ['agent', 'agent_flags', 'agent_snapshot', 'node'];
    return Object.fromEntries(
      lines.map((l) => [l.slice(0, Math.max(0, l.indexOf('='))), l.slice(l.indexOf('=') + 1)] as const).filter(([k]) => wanted.includes(k)),
    );
  } catch {
    return {};
  }
}

function format(result: Record<string, unknown>): string {
  const summary = result.summary as Record<string, Record<string, number>>;
  const names = Object.keys(summary);
  const row = (label: string, key: string, unit: string): string =>
    `${label.padEnd(34)}${names.map((n) => `${summary[n]![key]!.toFixed(0)} ${unit}`.padStart(14)).join('')}`;
  const ratios = result.ratios as Record<string, { agentStart: number; contToAgent: number }>;
  return [
    `agent start, medians of ${result.rounds} boots each (${result.memoryMiB} MiB VM):`,
    `${''.padEnd(34)}${names.map((n) => n.padStart(14)).join('')}`,
    row('agent start (guest clock)', 'agentStartMs', 'ms'),
    row('  of it node + agent code loaded', 'nodeAndLoadMs', 'ms'),
    row('cont -> agent bytes (host clock)', 'contToAgentMs', 'ms'),
    row('QEMU RSS then', 'qemuRssMiB', 'MiB'),
    ...Object.entries(ratios).map(([k, r]) => `${k}: agent start ${r.agentStart.toFixed(2)}x, cont -> agent ${r.contToAgent.toFixed(2)}x`),
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values } = parseArgs({
    options: { rounds: { type: 'string', default: '3' }, guest: { type: 'string', multiple: true }, json: { type: 'boolean' } },
  });
  const guests =
    values.guest === undefined
      ? defaultGuests()
      : values.guest.map((g) => {
          const eq = g.indexOf('=');
          if (eq <= 0) throw new Error(`--guest ${g}: expected NAME=DIR`);
          return { name: g.slice(0, eq), dir: path.resolve(g.slice(eq + 1)) };
        });
  const result = await runAgentStartBench(Number(values.rounds), guests, (line) => console.error(line));
  console.log(values.json === true ? JSON.stringify(result) : format(result));
}
