/**
 * Fuzzing the CRI surface over the real socket of a real `kata-ts serve` (fast-check, bounded):
 * random requests of every unary rpc built from the proto (nasty strings, traversal, control
 * characters, negative and absurd numbers, unknown enum values, big maps), byte mutations of
 * encoded requests, raw bytes that are not protobuf, and RunPodSandbox/CreateContainer requests
 * that are valid but for one hostile field. Properties: the daemon never crashes; every request is
 * answered with a gRPC status before its deadline, never UNKNOWN nor an INTERNAL that is not one of
 * ours; one log line per request; nothing changes (no request can succeed in creating anything:
 * QEMU here is a stand-in that exits at once, so no VM boots and every RunPodSandbox that gets as
 * far as starting it is rolled back). Findings are collected and reported together.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type Client, status } from '@grpc/grpc-js';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_REQUEST_BYTES } from '../../../src/cri/server.js';
import { MAX_POD_ANNOTATIONS_BYTES } from '../../../src/runtime/spec/names.js';
import {
  annotationsOver,
  arbMessage,
  encodeLoosely,
  type FuzzRpc,
  hashedFiles,
  hostileKey,
  hostileName,
  mutation,
  nastyString,
  type RawOutcome,
  rawCall,
  rawClient,
  rawStream,
  unaryRpcs,
} from '../../helpers/cri-fuzz.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const DEADLINE_MS = 15_000;
const SEED = Number(process.env.KATA_TS_FUZZ_SEED ?? 20261124);
const RUNS = Number(process.env.KATA_TS_FUZZ_RUNS ?? 2);

describe('fuzzing the CRI surface over the socket', () => {
  let rt: TestRuntime;
  let raw: Client;
  let calls = 0;
  let baseline = '';
  const findings: string[] = [];
  const rpcs = unaryRpcs();

  async function snapshot(): Promise<string> {
    const sandboxes = await rt.cri.runtime.ListPodSandbox({});
    const containers = await rt.cri.runtime.ListContainers({});
    const images = await rt.cri.image.ListImages({});
    calls += 3;
    return JSON.stringify({ sandboxes, containers, images, files: await hashedFiles(rt.stateDir) });
  }

  /** Send one body and check every property; a violation is recorded, not thrown, to see them all. */
  async function check(target: FuzzRpc, body: Buffer, what: string): Promise<void> {
    await checkedOutcome(target, body, what);
  }

  /** check(), answering with the outcome for properties of its own. */
  async function checkedOutcome(target: FuzzRpc, body: Buffer, what: string): Promise<RawOutcome> {
    calls++;
    const out: RawOutcome = await rawCall(raw, target.path, body, DEADLINE_MS);
    const label = `${target.name} (${what}, ${body.length} bytes)`;
    const alive = (() => {
      try {
        process.kill(rt.pid(), 0);
        return true;
      } catch {
        return false;
      }
    })();
    if (!alive) {
      findings.push(`${label}: the daemon died`);
      await rt.start();
      baseline = await snapshot();
      return out;
    }
    if (out.code === status.UNKNOWN) findings.push(`${label}: UNKNOWN ${out.details}`);
    if (out.code === status.DEADLINE_EXCEEDED && out.reason === undefined) findings.push(`${label}: no answer within ${DEADLINE_MS} ms`);
    if (out.code === status.INTERNAL && out.reason !== 'QEMU_EXITED_AT_START')
      findings.push(`${label}: INTERNAL ${out.reason} ${out.details.slice(0, 300)}`);
    if (out.reason === undefined && out.code !== status.OK && out.code !== status.RESOURCE_EXHAUSTED) {
      findings.push(`${label}: status ${status[out.code]} without a kata-ts reason: ${out.details.slice(0, 200)}`);
    }
    const now = await snapshot();
    if (now !== baseline) {
      const [was, is] = [JSON.parse(baseline) as { files: string[] }, JSON.parse(now) as { files: string[] }];
      const diff = [
        ...is.files.filter((f) => !was.files.includes(f)).map((f) => `+${f}`),
        ...was.files.filter((f) => !is.files.includes(f)).map((f) => `-${f}`),
      ];
      findings.push(`${label}: answered ${status[out.code]} ${out.reason} but the state changed: ${diff.join(' ') || 'listings'}`);
      baseline = now;
    }
    return out;
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime();
    // A QEMU that exits at once: requests get as far as starting it, never to a booted VM.
    const fakeQemu = path.join(rt.dir, 'qemu-exits');
    await fsp.writeFile(fakeQemu, '#!/bin/sh\necho "fuzz stand-in: not starting" >&2\nexit 1\n');
    await fsp.chmod(fakeQemu, 0o755);
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    await fsp.writeFile(
      rt.configPath,
      JSON.stringify({
        ...cfg,
        logLevel: 'info',
        hypervisor: { ...(cfg.hypervisor as object), qemuBinary: fakeQemu, guestImagePath: null },
      }),
    );
    await rt.start();
    raw = rawClient(rt.socketPath);
    baseline = await snapshot();
  });
  afterAll(async () => {
    raw?.close();
    if (process.env.KATA_TS_FUZZ_LOG !== undefined) await fsp.copyFile(rt.logFile, process.env.KATA_TS_FUZZ_LOG).catch(() => undefined);
    await rt?.cleanup();
  });

  it(
    'random requests of every unary rpc, built from the proto',
    async () => {
      const arb = fc.constantFrom(...rpcs).chain((r) => arbMessage(r.requestType).map((m) => [r, m] as const));
      await fc.assert(
        fc.asyncProperty(arb, async ([r, m]) => check(r, encodeLoosely(r.requestType, m), 'random')),
        { seed: SEED, numRuns: 260 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(240_000),
  );

  it(
    'byte mutations of encoded requests, and raw bytes that are not protobuf',
    async () => {
      const arb = fc.constantFrom(...rpcs).chain((r) => fc.tuple(fc.constant(r), arbMessage(r.requestType, 2), mutation));
      await fc.assert(
        fc.asyncProperty(arb, async ([r, m, mutate]) => check(r, mutate(encodeLoosely(r.requestType, m)), 'mutated')),
        { seed: SEED + 1, numRuns: 120 * RUNS },
      );
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...rpcs), fc.uint8Array({ maxLength: 256 }), async (r, bytes) =>
          check(r, Buffer.from(bytes), 'raw'),
        ),
        { seed: SEED + 2, numRuns: 80 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(240_000),
  );

  it(
    'valid RunPodSandbox and CreateContainer requests but for one hostile field',
    async () => {
      const run = rpcs.find((r) => r.name === 'RunPodSandbox')!;
      const create = rpcs.find((r) => r.name === 'CreateContainer')!;
      const sizing = fc.constantFrom(
        'io.kubernetes.cri.sandbox-memory',
        'io.kubernetes.cri.sandbox-cpu-quota',
        'io.kubernetes.cri.sandbox-cpu-period',
        'io.kubernetes.cri.sandbox-cpu-shares',
        'io.kubernetes.cri-o.PodLinuxResources',
        'io.kubernetes.cri-o.PodLinuxOverhead',
        'cdi.k8s.io/x',
      );
      const quantity = fc.oneof(nastyString, fc.constantFrom('-5', '1e400', '9999999Ei', '0.0000000001', '1Gi', '500m'));
      const podEdit = fc.oneof(
        fc.tuple(sizing, nastyString).map(([k, v]) => (c: Record<string, unknown>) => ({ ...c, annotations: { [k]: v } })),
        nastyString.map((v) => (c: Record<string, unknown>) => ({ ...c, log_directory: v })),
        nastyString.map((v) => (c: Record<string, unknown>) => ({ ...c, hostname: v })),
        nastyString.map((v) => (c: Record<string, unknown>) => ({ ...c, linux: { ...(c.linux as object), cgroup_parent: v } })),
        nastyString.map((v) => (c: Record<string, unknown>) => ({ ...c, metadata: { ...(c.metadata as object), name: v } })),
        fc
          .tuple(fc.constantFrom('cpu', 'memory', 'hugepages-2Mi', 'ephemeral-storage', 'nvidia.com/gpu'), quantity)
          .map(([res, q]) => (c: Record<string, unknown>) => ({
            ...c,
            pod_resources: {
              containers: [
                {
                  name: 'a',
                  type: 'REGULAR_CONTAINER',
                  kubernetes_resources: { requests: { [res]: { string: q } }, limits: { [res]: { string: q } } },
                },
              ],
            },
          })),
        fc.tuple(fc.integer(), fc.integer(), nastyString).map(([cport, hport, ip]) => (c: Record<string, unknown>) => ({
          ...c,
          port_mappings: [{ protocol: 7, container_port: cport, host_port: hport, host_ip: ip }],
        })),
      );
      await fc.assert(
        fc.asyncProperty(podEdit, async (edit) => {
          const config = edit(podConfig(rt, 'fuzz'));
          await check(run, encodeLoosely(run.requestType, { config, runtime_handler: '' }), 'hostile pod');
        }),
        { seed: SEED + 3, numRuns: 80 * RUNS },
      );
      const containerEdit = fc.oneof(
        nastyString.map((v) => ({ log_path: v })),
        nastyString.map((v) => ({ working_dir: v })),
        fc.tuple(nastyString, nastyString).map(([c, h]) => ({ mounts: [{ container_path: c, host_path: h }] })),
        nastyString.map((v) => ({ image: { image: ` ${v}` } })),
        fc.array(nastyString, { maxLength: 3 }).map((v) => ({ command: v, args: v })),
        fc.tuple(nastyString, nastyString).map(([k, v]) => ({ envs: [{ key: k, value: v }] })),
        hostileName.map((v) => ({ metadata: { name: v, attempt: 0 } })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => ({ labels: { [k]: v } })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => ({ annotations: { [k]: v } })),
      );
      await fc.assert(
        fc.asyncProperty(containerEdit, nastyString, async (edit, sandboxId) => {
          const config = { metadata: { name: 'c', attempt: 0 }, image: { image: '127.0.0.1:1/busybox' }, log_path: 'c.log', ...edit };
          await check(
            create,
            encodeLoosely(create.requestType, { pod_sandbox_id: sandboxId, config, sandbox_config: podConfig(rt, 'fuzz') }),
            'hostile container',
          );
        }),
        { seed: SEED + 4, numRuns: 40 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(240_000),
  );

  it(
    'valid RunPodSandbox requests but for one hostile name: INVALID_ARGUMENT at decode, nothing changes',
    async () => {
      // Issue 21: a NUL byte, control characters, 300 KB, keys that are not qualified names and
      // annotation floods are refused before any directory, cgroup, netns or process exists.
      const run = rpcs.find((r) => r.name === 'RunPodSandbox')!;
      const nameEdit = fc.oneof(
        fc.tuple(fc.constantFrom('name', 'namespace', 'uid'), hostileName).map(([field, v]) => (c: Record<string, unknown>) => ({
          ...c,
          metadata: { ...(c.metadata as object), [field]: v },
        })),
        hostileName.map((v) => (c: Record<string, unknown>) => ({ ...c, hostname: v })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => (c: Record<string, unknown>) => ({
          ...c,
          labels: { ...(c.labels as object), [k]: v },
        })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => (c: Record<string, unknown>) => ({
          ...c,
          annotations: { ...(c.annotations as object), [k]: v },
        })),
        annotationsOver(MAX_POD_ANNOTATIONS_BYTES).map((a) => (c: Record<string, unknown>) => ({ ...c, annotations: a })),
      );
      await fc.assert(
        fc.asyncProperty(nameEdit, async (edit) => {
          const config = edit(podConfig(rt, 'fuzz'));
          const out = await checkedOutcome(run, encodeLoosely(run.requestType, { config, runtime_handler: '' }), 'hostile name');
          if (out.code !== status.INVALID_ARGUMENT)
            findings.push(`hostile name: answered ${status[out.code]} ${out.reason}, not INVALID_ARGUMENT`);
        }),
        { seed: SEED + 6, numRuns: 40 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(240_000),
  );

  it(
    'a request over the size cap is RESOURCE_EXHAUSTED from grpc-js and changes nothing',
    async () => {
      const run = rpcs.find((r) => r.name === 'RunPodSandbox')!;
      // A valid pod but for a name that takes the request past the cap.
      const config = podConfig(rt, 'fuzz');
      const fits = encodeLoosely(run.requestType, { config: { ...config, metadata: { ...(config.metadata as object), name: '' } } });
      const name = 'n'.repeat(MAX_REQUEST_BYTES - fits.length);
      const body = encodeLoosely(run.requestType, { config: { ...config, metadata: { ...(config.metadata as object), name } } });
      expect(body.length).toBeGreaterThan(MAX_REQUEST_BYTES);
      // Not counted in `calls`: grpc-js answers before the handler, so the daemon logs no line for it.
      const out = await rawCall(raw, run.path, body, DEADLINE_MS);
      expect(status[out.code]).toBe('RESOURCE_EXHAUSTED');
      const now = await snapshot();
      expect(now).toBe(baseline);
    },
    scaledMs(240_000),
  );

  it(
    'server-streaming rpcs: random and raw bodies get a status or a stream, never a crash',
    async () => {
      const streams = unaryRpcs(true);
      expect(streams.map((r) => r.name)).toContain('GetContainerEvents');
      const arb = fc.constantFrom(...streams).chain((r) =>
        fc.tuple(
          fc.constant(r),
          fc.oneof(
            arbMessage(r.requestType, 2).map((m) => encodeLoosely(r.requestType, m)),
            fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.from(b)),
          ),
        ),
      );
      await fc.assert(
        fc.asyncProperty(arb, async ([r, body]) => {
          // An events stream stays open until the client's deadline: that is its answer.
          const out = await rawStream(raw, r.path, body, 1_500);
          const label = `${r.name} (stream, ${body.length} bytes)`;
          if (out.code === status.UNKNOWN || out.code === status.INTERNAL)
            findings.push(`${label}: ${status[out.code]} ${out.details.slice(0, 200)}`);
          try {
            process.kill(rt.pid(), 0);
          } catch {
            findings.push(`${label}: the daemon died`);
            await rt.start();
          }
        }),
        { seed: SEED + 5, numRuns: 15 * RUNS },
      );
      const now = await snapshot();
      if (now !== baseline) findings.push('streams: the state changed');
      baseline = now;
      expect(findings).toEqual([]);
    },
    scaledMs(240_000),
  );

  it('logged exactly one line per request', async () => {
    // Let the last lines reach the log file.
    await new Promise((r) => setTimeout(r, 300));
    // Unary requests only: the streaming rpcs above log their own lines (stream done, stream failed).
    const streaming = new Set(unaryRpcs(true).map((r) => r.name));
    const done = (await rt.logLines()).filter(
      (l) => ['request done', 'request refused', 'request failed'].includes(String(l.msg)) && !streaming.has(String(l.rpc)),
    );
    expect(done.length).toBe(calls);
  });
});
