/**
 * Pod + first container **with attestation and one secret** against **the same pod without
 * attestation** (issue 32's measure; goal <= 1.2), in one run:
 *
 * - a real `kata-ts serve` in a node network namespace of the bench's own with a CNI bridge
 *   (test/helpers/network-node.ts), and `kata-ts broker serve` in the same namespace on the
 *   bridge's gateway address, its certificate made for that address;
 * - both pods on `kata-ts-cvm` (vtpm here: OVMF, a swtpm per pod), both with an initdata document
 *   (PCR 8 extended either way); the attested pod's names the broker and its annotation asks one
 *   resource for its container, so the agent attests at start and StartContainer waits for the
 *   secret; the other's initdata names no broker and asks nothing;
 * - timed: RunPodSandbox + CreateContainer + StartContainer until StartContainer answers; rounds
 *   alternate which pod goes first. The broker's one reference set is predicted before any boot
 *   (`kata-ts plan --measurements`), as an operator would.
 *
 *   node --import tsx bench/attest-pod.ts [--rounds N] [--console-dir DIR] [--json]
 *
 * --console-dir keeps each pod's guest console (the agent's log: when it attested, each retry)
 * for reading where the difference goes.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { gzipSync } from 'node:zlib';
import { packageRoot } from '../src/common/paths.js';
import { DEFAULT_GUEST_DIR } from '../src/config/defaults.js';
import { netnsNameFor } from '../src/network/index.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../test/helpers/busybox-image.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import { createNetworkNode } from '../test/helpers/network-node.js';
import { kataTsCli, type NodeBroker, startNodeBroker } from '../test/helpers/node-broker.js';
import { benchPodConfig, createBenchDaemon } from './lib/daemon.js';
import { median } from './lib/proc.js';

const ROOT = packageRoot();
const HANDLER = 'kata-ts-cvm';
const RESOURCE = 'bench/db/password';
const GOAL = 1.2;

export interface AttestPodBenchResult {
  bench: 'attest-pod';
  date: string;
  loadavg1: [number, number];
  rounds: Array<{ order: string[]; attestedMs: number; plainMs: number }>;
  medianAttestedMs: number;
  medianPlainMs: number;
  ratio: number;
}

export async function runAttestPodBench(
  rounds: number,
  /** Where each pod's guest console (the agent's log, with its attestation steps) is copied; null: nowhere. */
  consoleDir: string | null = null,
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<AttestPodBenchResult> {
  // The guest of this tree (its agent attests): build-guest.sh does nothing when it is up to date.
  execFileSync('bash', [path.join(ROOT, 'scripts/build-guest.sh'), '--out', process.env.KATA_TS_GUEST_DIR ?? DEFAULT_GUEST_DIR], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const node = await createNetworkNode();
  const registry = await startRegistry();
  const rt = await createBenchDaemon({ images: { registriesConfigPath: '/dev/null' }, network: node.networkConfig() });
  const sandboxes: string[] = [];
  let broker: NodeBroker | undefined;
  try {
    const image = await pushBusyboxImage(registry, 'bench/attest', '1.0', ['sleep', 'cat']);
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    await rt.stop();
    rt.netnsPath = node.netnsPath;
    await rt.start();

    broker = await startNodeBroker(node, { dir: path.join(rt.dir, 'broker'), tpmCaDir: path.join(rt.dir, 'tpm-ca'), logDir: rt.dir });
    const { certPem, url } = broker;
    const brokerDir = broker.dir;
    const secretFile = path.join(rt.dir, 'secret.in');
    await fsp.writeFile(secretFile, randomBytes(32).toString('hex'), { mode: 0o600 });
    kataTsCli(['broker', 'resource', 'set', RESOURCE, '--dir', brokerDir, '--file', secretFile]);
    await fsp.rm(secretFile);

    const initdata = (withBroker: boolean) =>
      gzipSync(
        Buffer.from(
          `version = "0.1.0"\nalgorithm = "sha256"\n\n[data]\n${
            withBroker ? `"aa.toml" = '''\n[token_configs.kbs]\nurl = "${url}"\ncert = """\n${certPem}\n"""\n'''\n` : ''
          }"note" = "bench"\n`,
        ),
      ).toString('base64');
    const attestedAnnotations = {
      'io.kata-ts.initdata': initdata(true),
      'io.kata-ts.secrets': JSON.stringify({ app: [{ resource: `kbs:///${RESOURCE}`, path: '/run/secrets/db' }] }),
    };
    const plainAnnotations = { 'io.kata-ts.initdata': initdata(false) };
    const config = (name: string, annotations: Record<string, string>) => ({ ...benchPodConfig(rt, name), hostname: name, annotations });

    // The reference set, predicted before any boot.
    const request = path.join(rt.dir, 'request.json');
    await fsp.writeFile(request, JSON.stringify({ config: config('attested-ref', attestedAnnotations), runtime_handler: HANDLER }));
    const planFile = path.join(rt.dir, 'reference.json');
    await fsp.writeFile(
      planFile,
      kataTsCli(['plan', '--measurements', '--request', request, '--config', rt.configPath, '--handler', HANDLER, '--format', 'json']),
    );
    kataTsCli(['broker', 'reference', 'add', 'bench', '--dir', brokerDir, '--file', planFile]);
    const policy = path.join(rt.dir, 'policy.json');
    await fsp.writeFile(policy, JSON.stringify({ schema: 'kata-ts/broker-policy/v1', resources: [{ path: RESOURCE, allow: ['bench'] }] }));
    kataTsCli(['broker', 'policy', 'set', '--dir', brokerDir, '--file', policy]);

    const podWithContainer = async (name: string, annotations: Record<string, string>) => {
      const cfg = config(name, annotations);
      const t0 = performance.now();
      const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config: cfg, runtime_handler: HANDLER });
      sandboxes.push(sid);
      const { container_id: cid } = await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: { metadata: { name: 'app', attempt: 0 }, image: { image }, command: ['sleep', '100000'] },
        sandbox_config: cfg,
      });
      await rt.cri.runtime.StartContainer({ container_id: cid });
      const ms = performance.now() - t0;
      if (consoleDir !== null) {
        const info = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid, verbose: true });
        const parsed = JSON.parse(info.info.info ?? '{}') as { workDir?: string; confinement?: { vmmDir?: string | null } | null };
        await fsp.mkdir(consoleDir, { recursive: true });
        // A confined VMM writes its console in its own dir, else in the pod's work dir.
        for (const dir of [parsed.confinement?.vmmDir, parsed.workDir]) {
          if (typeof dir !== 'string') continue;
          const copied = await fsp.copyFile(path.join(dir, 'console.log'), path.join(consoleDir, `${name}.console.log`)).then(
            () => true,
            () => false,
          );
          if (copied) break;
        }
      }
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      sandboxes.splice(sandboxes.indexOf(sid), 1);
      return ms;
    };

    progress('warm-up: one attested and one plain pod (not counted)');
    await podWithContainer('warm-attested', attestedAnnotations);
    await podWithContainer('warm-plain', plainAnnotations);
    const loadBefore = os.loadavg()[0]!;
    const samples: AttestPodBenchResult['rounds'] = [];
    for (let r = 0; r < rounds; r++) {
      const s = { order: [] as string[], attestedMs: 0, plainMs: 0 };
      const steps: Record<string, () => Promise<void>> = {
        attested: async () => {
          s.attestedMs = await podWithContainer(`attested-${r}`, attestedAnnotations);
        },
        plain: async () => {
          s.plainMs = await podWithContainer(`plain-${r}`, plainAnnotations);
        },
      };
      s.order = r % 2 === 0 ? ['attested', 'plain'] : ['plain', 'attested'];
      for (const name of s.order) await steps[name]!();
      samples.push(s);
      progress(
        `round ${r + 1}/${rounds} (${s.order.join(', ')}): attested ${s.attestedMs.toFixed(0)} ms, plain ${s.plainMs.toFixed(0)} ms`,
      );
    }
    const m = (k: 'attestedMs' | 'plainMs') => median(samples.map((x) => x[k]));
    return {
      bench: 'attest-pod',
      date: new Date().toISOString(),
      loadavg1: [loadBefore, os.loadavg()[0]!],
      rounds: samples,
      medianAttestedMs: m('attestedMs'),
      medianPlainMs: m('plainMs'),
      ratio: m('attestedMs') / m('plainMs'),
    };
  } finally {
    for (const id of sandboxes) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
    await rt.cleanup();
    await broker?.stop();
    await node.cleanup(sandboxes.map(netnsNameFor));
    await registry.stop();
  }
}

export function formatAttestPodReport(r: AttestPodBenchResult): string {
  return [
    `pod + first container with attestation and one secret against the same pod without (${r.rounds.length} rounds; load ${r.loadavg1.map((l) => l.toFixed(1)).join(' -> ')})`,
    ...r.rounds.map(
      (s, i) => `  round ${i + 1} (${s.order.join(', ')}): attested ${s.attestedMs.toFixed(0)} ms, plain ${s.plainMs.toFixed(0)} ms`,
    ),
    `  median: attested ${r.medianAttestedMs.toFixed(0)} ms, plain ${r.medianPlainMs.toFixed(0)} ms`,
    `  attested / plain ${r.ratio.toFixed(3)} (goal <= ${GOAL}: ${r.ratio <= GOAL ? 'met' : 'not met'})`,
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { rounds: { type: 'string', default: '3' }, json: { type: 'boolean', default: false }, 'console-dir': { type: 'string' } },
  });
  const result = await runAttestPodBench(Number(values.rounds), values['console-dir'] ?? null);
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatAttestPodReport(result)}\n`);
}
