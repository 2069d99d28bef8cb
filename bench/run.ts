/**
 * Every bench, in sequence: bench/sizing.ts, bench/boot.ts, bench/guest-boot.ts,
 * bench/pod-container.ts, bench/shim.ts, bench/confine.ts, bench/vtpm.ts, bench/attest.ts, bench/attest-pod.ts (what `npm run bench` runs). Options are passed through to the benches that take them; `--only NAME` runs one.
 *
 *   node --import tsx bench/run.ts [--rounds N] [--round-ms MS] [--bare-mode direct|paused]
 *                                  [--rss-pods N] [--ready-timeout-ms MS] [--only NAME] [--json]
 *
 * With --json, stdout carries one JSON line per bench. bench/sizing.ts has no JSON mode of its
 * own, so here it is run in-process through its exported runSizingBench().
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { packageRoot } from '../src/common/paths.js';
import { runSizingBench } from './sizing.js';

const BENCHES = {
  sizing: ['rounds', 'round-ms'],
  boot: ['rounds', 'bare-mode', 'rss-pods', 'ready-timeout-ms', 'json'],
  'guest-boot': ['rounds', 'json'],
  'pod-container': ['rounds', 'json'],
  shim: ['rounds', 'json'],
  confine: ['rounds', 'json'],
  vtpm: ['rounds', 'json'],
  attest: ['json'],
  'attest-pod': ['rounds', 'json'],
} as const;
type BenchName = keyof typeof BENCHES;

const { values } = parseArgs({
  options: {
    rounds: { type: 'string' },
    'round-ms': { type: 'string' },
    'bare-mode': { type: 'string' },
    'rss-pods': { type: 'string' },
    'ready-timeout-ms': { type: 'string' },
    json: { type: 'boolean' },
    only: { type: 'string' },
  },
});
const only = values.only;
if (only !== undefined && !(only in BENCHES)) {
  console.error(`--only must be one of ${Object.keys(BENCHES).join(', ')}, not ${JSON.stringify(only)}`);
  process.exit(2);
}

/** The command-line options `bench` accepts, taken from ours. */
function argsFor(bench: BenchName): string[] {
  const args: string[] = [];
  for (const name of BENCHES[bench]) {
    const value = values[name as keyof typeof values];
    if (value === undefined || value === false) continue;
    args.push(`--${name}`, ...(value === true ? [] : [String(value)]));
  }
  return args;
}

/**
 * A child per bench: each keeps its own command line, output and exit status. SIGINT/SIGTERM sent
 * to this process alone are passed on, so the bench can clean up (its VMs, daemon, cgroups).
 */
function runChild(bench: BenchName): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join('bench', `${bench}.ts`), ...argsFor(bench)], {
    cwd: packageRoot(),
    stdio: 'inherit',
  });
  const forward = (signal: NodeJS.Signals): void => {
    child.kill(signal);
  };
  process.on('SIGINT', forward);
  process.on('SIGTERM', forward);
  return new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      process.off('SIGINT', forward);
      process.off('SIGTERM', forward);
      resolve({ code, signal });
    });
  });
}

let failed = false;
for (const bench of Object.keys(BENCHES) as BenchName[]) {
  if (only !== undefined && only !== bench) continue;
  if (bench === 'sizing' && values.json === true) {
    const rounds = Number(values.rounds ?? 10);
    const roundMs = Number(values['round-ms'] ?? 200);
    console.log(JSON.stringify({ bench: 'sizing', date: new Date().toISOString(), rounds, roundMs, ...runSizingBench(rounds, roundMs) }));
    continue;
  }
  const res = await runChild(bench);
  if (res.code !== 0) {
    console.error(`bench ${bench} failed (${res.signal ?? `exit code ${res.code}`})`);
    failed = true;
    if (res.code === 130) break; // interrupted: do not start the next one
  }
  if (values.json !== true) console.log('');
}
process.exitCode = failed ? 1 : 0;
