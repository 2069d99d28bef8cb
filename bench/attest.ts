/**
 * What attestation costs (issue 32's measures), in one run:
 *
 * 1. **Broker throughput**: a real `kata-ts broker serve` (its own state dir, HTTPS on 127.0.0.1)
 *    and 1, 2, 4 and 8 concurrent clients, each a stand-in pod (test/helpers/tpm-evidence-tool.ts:
 *    a real swtpm with a CA-signed EK certificate, the guest's own TPM code for credential
 *    activation and the quote; the firmware's events are the tool's stand-in). Each client runs
 *    whole RCAR rounds (auth, attest with fresh evidence, one resource decrypted) for
 *    `--seconds`; reported: rounds per second at each concurrency, and the broker's own CPU per
 *    round (from /proc/<pid>/stat). The clients' TPMs share the machine's two cores with the
 *    broker, so the figure is the lab's, not a broker alone on a big host.
 * 2. **Pod + first container with attestation and one secret** against the same pod without
 *    attestation: see bench/attest-pod.ts (it needs a pod network the guest reaches the broker by).
 *
 *   node --import tsx bench/attest.ts [--seconds S] [--concurrency 1,2,4,8] [--json]
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { packageRoot } from '../src/common/paths.js';
import { REFERENCE_VALUES_SCHEMA } from '../src/measure/reference-values.js';
import { makeToolCa, type ToolCa, TpmEvidenceTool } from '../test/helpers/tpm-evidence-tool.js';
import { kbsRound } from './lib/kbs-bench-client.js';

const ROOT = packageRoot();
const INITDATA =
  'version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n"aa.toml" = \'\'\'\n[token_configs.kbs]\nurl = "https://127.0.0.1"\n\'\'\'\n';
const SECRET = 'bench secret';
const RESOURCE = 'bench/key/one';

export interface BrokerBenchResult {
  bench: 'attest-broker';
  date: string;
  loadavg1: [number, number];
  seconds: number;
  levels: Array<{ concurrency: number; rounds: number; roundsPerSecond: number; brokerCpuMsPerRound: number; failures: number }>;
}

function cli(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', 'broker', ...args], { cwd: ROOT }, (err, stdout, stderr) =>
      err === null ? resolve(stdout) : reject(new Error(`kata-ts broker ${args[0]} failed: ${stderr.trim()}`)),
    );
  });
}

/** utime + stime of a process, in ms (clock ticks of 10 ms on Linux). */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

async function startServe(dir: string, bundle: string): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'src/cli/entry.ts', 'broker', 'serve', '--dir', dir, '--listen', '127.0.0.1:0', '--tpm-ca-bundle', bundle],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'ignore'] },
  );
  let out = '';
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout?.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /listening on https:\/\/127\.0\.0\.1:([0-9]+)/.exec(out);
      if (m !== null) resolve(Number(m[1]));
    });
    child.once('exit', (code) => reject(new Error(`broker serve exited ${code}`)));
  });
  return { child, port };
}

export async function runBrokerBench(
  seconds: number,
  levels: number[],
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<BrokerBenchResult> {
  const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-bench-attest-'));
  const tools: TpmEvidenceTool[] = [];
  let ca: ToolCa | undefined;
  let serve: { child: ChildProcess; port: number } | undefined;
  try {
    ca = await makeToolCa(tmp);
    const max = Math.max(...levels);
    for (let i = 0; i < max; i++) tools.push(await TpmEvidenceTool.start({ ca, initdata: Buffer.from(INITDATA), parentDir: tmp }));
    const dir = path.join(tmp, 'broker');
    await cli(['init', '--dir', dir, '--san', 'IP:127.0.0.1']);
    const bundle = path.join(tmp, 'bundle.pem');
    await fsp.writeFile(bundle, ca.bundlePem);
    // Every stand-in pod boots the same stand-in firmware with the same initdata: one reference set.
    const pcrs = await tools[0]!.pcrs([4, 8, 9]);
    const reference = {
      schema: REFERENCE_VALUES_SCHEMA,
      pod: { name: 'bench', namespace: 'bench', uid: 'bench' },
      handler: 'kata-ts-cvm',
      tee: 'vtpm',
      inputs: {
        kernelSha256: '1'.repeat(64),
        initrdSha256: '2'.repeat(64),
        cmdline: 'console=ttyS0',
        ramBelow4GiBBytes: 1 << 30,
        initdataSha256: createHash('sha256').update(INITDATA).digest('hex'),
      },
      vtpm: { bank: 'sha256', pcrs: { '4': pcrs[4], '8': pcrs[8], '9': pcrs[9] }, events: [], notPredicted: [] },
    };
    await fsp.writeFile(path.join(tmp, 'ref.json'), JSON.stringify(reference));
    await cli(['reference', 'add', 'bench', '--dir', dir, '--file', path.join(tmp, 'ref.json')]);
    await fsp.writeFile(path.join(tmp, 'secret'), SECRET);
    await cli(['resource', 'set', RESOURCE, '--dir', dir, '--file', path.join(tmp, 'secret')]);
    await fsp.writeFile(
      path.join(tmp, 'policy.json'),
      JSON.stringify({ schema: 'kata-ts/broker-policy/v1', resources: [{ path: RESOURCE, allow: ['bench'] }] }),
    );
    await cli(['policy', 'set', '--dir', dir, '--file', path.join(tmp, 'policy.json')]);
    serve = await startServe(dir, bundle);
    const target = { host: '127.0.0.1', port: serve.port, certPem: await fsp.readFile(path.join(dir, 'tls', 'cert.pem'), 'utf8') };
    const agent = new https.Agent({ keepAlive: true, maxSockets: max });
    const loadBefore = os.loadavg()[0]!;

    // Warm-up: one round per tool (the broker's first verifications, each swtpm's first keys).
    for (const t of tools) {
      const got = await kbsRound(target, agent, t, INITDATA, RESOURCE);
      if (got.toString() !== SECRET) throw new Error('the warm-up round decrypted something else than the resource');
    }
    const out: BrokerBenchResult['levels'] = [];
    for (const c of levels) {
      const cpu0 = cpuMs(serve.child.pid!);
      const deadline = performance.now() + seconds * 1000;
      let rounds = 0;
      let failures = 0;
      await Promise.all(
        tools.slice(0, c).map(async (t) => {
          while (performance.now() < deadline) {
            try {
              await kbsRound(target, agent, t, INITDATA, RESOURCE);
              rounds++;
            } catch {
              failures++;
            }
          }
        }),
      );
      const cpu = cpuMs(serve.child.pid!) - cpu0;
      const level = {
        concurrency: c,
        rounds,
        roundsPerSecond: rounds / seconds,
        brokerCpuMsPerRound: rounds === 0 ? 0 : cpu / rounds,
        failures,
      };
      out.push(level);
      progress(
        `concurrency ${c}: ${rounds} rounds in ${seconds} s (${level.roundsPerSecond.toFixed(1)}/s), broker CPU ${level.brokerCpuMsPerRound.toFixed(1)} ms per round, ${failures} failed`,
      );
    }
    agent.destroy();
    return { bench: 'attest-broker', date: new Date().toISOString(), loadavg1: [loadBefore, os.loadavg()[0]!], seconds, levels: out };
  } finally {
    if (serve?.child.pid !== undefined && serve.child.exitCode === null) {
      const gone = new Promise<void>((r) => serve?.child.once('exit', () => r()));
      serve.child.kill('SIGTERM');
      await gone;
    }
    for (const t of tools) await t.close();
    await ca?.cleanup();
    await fsp.rm(tmp, { recursive: true, force: true });
  }
}

export function formatBrokerReport(r: BrokerBenchResult): string {
  const base = r.levels[0];
  return [
    `broker throughput: whole RCAR rounds (auth, attest with fresh swtpm evidence, one resource) for ${r.seconds} s per level (load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    ...r.levels.map(
      (l) =>
        `  ${String(l.concurrency).padStart(2)} concurrent: ${l.roundsPerSecond.toFixed(1)} rounds/s (x${base === undefined || base.roundsPerSecond === 0 ? '-' : (l.roundsPerSecond / base.roundsPerSecond).toFixed(2)} of 1), broker CPU ${l.brokerCpuMsPerRound.toFixed(1)} ms/round${l.failures > 0 ? `, ${l.failures} failed` : ''}`,
    ),
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      seconds: { type: 'string', default: '10' },
      concurrency: { type: 'string', default: '1,2,4,8' },
      json: { type: 'boolean', default: false },
    },
  });
  const levels = values.concurrency.split(',').map(Number);
  if (levels.some((n) => !Number.isInteger(n) || n < 1 || n > 64)) {
    process.stderr.write('--concurrency takes a comma-separated list of integers 1..64\n');
    process.exit(2);
  }
  const result = await runBrokerBench(Number(values.seconds), levels);
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatBrokerReport(result)}\n`);
}
