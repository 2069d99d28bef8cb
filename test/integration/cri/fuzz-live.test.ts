/**
 * Fuzzing the container rpcs against a live sandbox: one real pod VM (QEMU under TCG, the guest
 * agent, crun, virtio-fs) with a running container and a created one, and fast-check requests
 * whose ids point at them while every other field is random or hostile (nasty strings, negative
 * and absurd numbers, unknown enums, huge maps): ExecSync, Exec, Attach, PortForward,
 * ContainerStatus, ContainerStats, UpdateContainerResources, ReopenContainerLog, StartContainer on
 * the running one, PodSandboxStatus, PodSandboxStats, and CreateContainer in the live pod (random
 * configs, and valid ones but for one hostile field, started when they are accepted).
 * Properties: the daemon never crashes; every request gets a status before its deadline, never
 * UNKNOWN nor INTERNAL; a refused request changes nothing (listings and records); an accepted
 * CreateContainer is removed again and leaves nothing; the pod stays READY and its container
 * RUNNING and answering throughout. (test/integration/cri/fuzz.test.ts fuzzes every rpc with
 * no VM behind it.)
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type Client, status } from '@grpc/grpc-js';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { MAX_CONTAINER_ANNOTATIONS_BYTES } from '../../../src/runtime/spec/names.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import {
  annotationsOver,
  arbMessage,
  encodeLoosely,
  type FuzzRpc,
  hashedFiles,
  hostileKey,
  hostileName,
  nastyString,
  type RawOutcome,
  rawCall,
  rawClient,
  unaryRpcs,
} from '../../helpers/cri-fuzz.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const DEADLINE_MS = 30_000;
const SEED = Number(process.env.KATA_TS_FUZZ_SEED ?? 20261124);
const RUNS = Number(process.env.KATA_TS_FUZZ_RUNS ?? 1);

/** Rpcs aimed at the live container (`container_id`) or the live pod (`pod_sandbox_id`). */
const CONTAINER_RPCS = [
  'ExecSync',
  'Exec',
  'Attach',
  'ContainerStatus',
  'ContainerStats',
  'UpdateContainerResources',
  'ReopenContainerLog',
  'StartContainer',
];
const POD_RPCS = ['PortForward', 'PodSandboxStatus', 'PodSandboxStats', 'CreateContainer'];

describe('fuzzing the container rpcs against a live sandbox (real VM)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let raw: Client;
  let image = '';
  let sid = '';
  let running = '';
  let created = '';
  let sandboxConfig: Record<string, unknown> = {};
  let baseline = '';
  let accepted = 0;
  /** `<rpc> <status>` -> count: printed, to see how deep the requests went. */
  const tally = new Map<string, number>();
  const findings: string[] = [];
  const rpcs = unaryRpcs();
  const byName = (name: string): FuzzRpc => rpcs.find((r) => r.name === name)!;

  /** A `sleep` container in the live pod, with `extra` config fields. */
  async function create(name: string, extra: Record<string, unknown> = {}): Promise<string> {
    const config = { metadata: { name, attempt: 0 }, image: { image }, command: ['sleep', '100000'], log_path: `${name}.log`, ...extra };
    return (await rt.cri.runtime.CreateContainer({ pod_sandbox_id: sid, config, sandbox_config: sandboxConfig })).container_id;
  }

  async function snapshot(): Promise<string> {
    const { items } = await rt.cri.runtime.ListPodSandbox({});
    const { containers } = await rt.cri.runtime.ListContainers({});
    return JSON.stringify({
      sandboxes: items.map((s) => `${s.id}:${s.state}`).sort(),
      containers: containers.map((c) => `${c.id}:${c.state}`).sort(),
      // The sandbox and container records: what a refused request must not touch.
      records: [...(await hashedFiles(path.join(rt.stateDir, 'sandboxes'))), ...(await hashedFiles(path.join(rt.stateDir, 'containers')))],
    });
  }

  /** Send one body; check the answer, that the daemon lives, and what changed. */
  async function check(target: FuzzRpc, body: Buffer, what: string): Promise<RawOutcome> {
    const out = await rawCall(raw, target.path, body, DEADLINE_MS);
    const label = `${target.name} (${what}, ${body.length} bytes)`;
    const key = `${target.name} ${status[out.code]}${out.reason === undefined ? '' : ` ${out.reason}`}`;
    tally.set(key, (tally.get(key) ?? 0) + 1);
    try {
      process.kill(rt.pid(), 0);
    } catch {
      findings.push(`${label}: the daemon died`);
      await rt.start();
    }
    if (out.code === status.UNKNOWN) findings.push(`${label}: UNKNOWN ${out.details}`);
    if (out.code === status.DEADLINE_EXCEEDED && out.reason === undefined) findings.push(`${label}: no answer within ${DEADLINE_MS} ms`);
    if (out.code === status.INTERNAL) findings.push(`${label}: INTERNAL ${out.reason} ${out.details.slice(0, 300)}`);
    if (out.code === status.OK) {
      accepted++;
      return out;
    }
    const now = await snapshot();
    if (now !== baseline) {
      findings.push(`${label}: refused (${status[out.code]} ${out.reason}: ${out.details.slice(0, 120)}) but the state changed`);
      baseline = now;
    }
    return out;
  }

  /** After an accepted request: remove any container it made; the state must be the baseline again. */
  async function settle(label: string): Promise<void> {
    const { containers } = await rt.cri.runtime.ListContainers({});
    for (const c of containers) {
      if (c.id === running || c.id === created) continue;
      await rt.cri.runtime.StopContainer({ container_id: c.id, timeout: 0 });
      await rt.cri.runtime.RemoveContainer({ container_id: c.id });
    }
    const now = await snapshot();
    const was = JSON.parse(baseline) as { sandboxes: string[]; containers: string[] };
    const is = JSON.parse(now) as { sandboxes: string[]; containers: string[] };
    if (JSON.stringify([was.sandboxes, was.containers]) !== JSON.stringify([is.sandboxes, is.containers]))
      findings.push(`${label}: after clean-up the listings are ${now}, not ${baseline}`);
    // An accepted UpdateContainerResources rewrites the container's record: that is the new baseline.
    baseline = now;
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'fuzz/busybox', '1.0', ['sleep']);
    rt = await createTestRuntime({ logLevel: 'info', images: { registriesConfigPath: '/dev/null' } });
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    sandboxConfig = { ...podConfig(rt, 'fuzz-live'), log_directory: path.join(rt.dir, 'pod-logs') };
    sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
    running = await create('running');
    await rt.cri.runtime.StartContainer({ container_id: running });
    created = await create('created');
    raw = rawClient(rt.socketPath);
    baseline = await snapshot();
  }, scaledMs(300_000));

  afterAll(async () => {
    console.log(
      [...tally]
        .sort()
        .map(([k, n]) => `${n.toString().padStart(4)} ${k}`)
        .join('\n'),
    );
    raw?.close();
    if (process.env.KATA_TS_FUZZ_LOG !== undefined && rt !== undefined)
      await fsp.copyFile(rt.logFile, process.env.KATA_TS_FUZZ_LOG).catch(() => undefined);
    await rt?.cleanup();
    await registry?.stop();
  });

  it(
    'random requests aimed at the live container and pod',
    async () => {
      const targets = [...CONTAINER_RPCS, ...POD_RPCS].map(byName);
      const arb = fc
        .constantFrom(...targets)
        .chain((r) => fc.tuple(fc.constant(r), arbMessage(r.requestType, 3), fc.boolean(), fc.integer({ min: 0, max: 9 })));
      await fc.assert(
        fc.asyncProperty(arb, async ([r, message, aimAtCreated, miss]) => {
          const m = { ...message };
          // Mostly the live ids (StartContainer only ever the running one: starting the created one
          // is a legitimate change); now and then the random id, so NOT_FOUND paths run too.
          if (miss > 0) {
            if ('container_id' in r.requestType.fields) m.container_id = aimAtCreated && r.name !== 'StartContainer' ? created : running;
            if ('pod_sandbox_id' in r.requestType.fields) m.pod_sandbox_id = sid;
          }
          const out = await check(r, encodeLoosely(r.requestType, m), `random, live ids: ${JSON.stringify(m).slice(0, 160)}`);
          if (out.code === status.OK) await settle(`${r.name} (random)`);
        }),
        { seed: SEED, numRuns: 250 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(900_000),
  );

  it(
    'valid containers in the live pod but for one hostile field, started when accepted',
    async () => {
      const createRpc = byName('CreateContainer');
      const edit = fc.oneof(
        nastyString.map((v) => ({ log_path: v })),
        nastyString.map((v) => ({ working_dir: v })),
        fc.tuple(nastyString, nastyString).map(([c, h]) => ({ mounts: [{ container_path: c, host_path: h }] })),
        fc.tuple(nastyString, nastyString).map(([c, h]) => ({ devices: [{ container_path: c, host_path: h, permissions: 'rwm' }] })),
        fc.array(nastyString, { maxLength: 3 }).map((v) => ({ command: ['sleep', ...v] })),
        fc.tuple(nastyString, nastyString).map(([k, v]) => ({ envs: [{ key: k, value: v }] })),
        fc.tuple(nastyString, nastyString).map(([k, v]) => ({ annotations: { [k]: v } })),
        fc.integer().map((n) => ({ linux: { resources: { memory_limit_in_bytes: n, cpu_shares: n } } })),
        fc.integer().map((n) => ({ linux: { security_context: { run_as_user: { value: n } } } })),
      );
      await fc.assert(
        fc.asyncProperty(edit, async (e) => {
          const config = {
            metadata: { name: 'hostile', attempt: 0 },
            image: { image },
            command: ['sleep', '1000'],
            log_path: 'hostile.log',
            ...e,
          };
          const out = await check(
            createRpc,
            encodeLoosely(createRpc.requestType, { pod_sandbox_id: sid, config, sandbox_config: sandboxConfig }),
            `hostile container ${JSON.stringify(e).slice(0, 80)}`,
          );
          if (out.code !== status.OK) return;
          const { containers } = await rt.cri.runtime.ListContainers({});
          const id = containers.find((c) => c.id !== running && c.id !== created)?.id;
          if (id !== undefined) {
            const started = await rawCall(
              raw,
              byName('StartContainer').path,
              encodeLoosely(byName('StartContainer').requestType, { container_id: id }),
              DEADLINE_MS,
            );
            if (started.code === status.INTERNAL || started.code === status.UNKNOWN)
              findings.push(
                `StartContainer of ${JSON.stringify(e).slice(0, 80)}: ${status[started.code]} ${started.details.slice(0, 200)}`,
              );
          }
          await settle('hostile container');
        }),
        { seed: SEED + 1, numRuns: 60 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(900_000),
  );

  it(
    'containers in the live pod but for one hostile name: INVALID_ARGUMENT at decode, nothing changes',
    async () => {
      // Issue 21: refused before a root filesystem, a shared directory or a guest call exists.
      const createRpc = byName('CreateContainer');
      const edit = fc.oneof(
        hostileName.map((v) => ({ metadata: { name: v, attempt: 0 } })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => ({ labels: { [k]: v } })),
        fc.tuple(hostileKey, nastyString).map(([k, v]) => ({ annotations: { [k]: v } })),
        annotationsOver(MAX_CONTAINER_ANNOTATIONS_BYTES).map((a) => ({ annotations: a })),
      );
      await fc.assert(
        fc.asyncProperty(edit, async (e) => {
          const config = { metadata: { name: 'hostile-name', attempt: 0 }, image: { image }, command: ['sleep', '1000'], ...e };
          const out = await check(
            createRpc,
            encodeLoosely(createRpc.requestType, { pod_sandbox_id: sid, config, sandbox_config: sandboxConfig }),
            `hostile name ${JSON.stringify(e).slice(0, 80)}`,
          );
          if (out.code !== status.INVALID_ARGUMENT)
            findings.push(
              `hostile name ${JSON.stringify(e).slice(0, 80)}: answered ${status[out.code]} ${out.reason}, not INVALID_ARGUMENT`,
            );
          if (out.code === status.OK) await settle('hostile name');
        }),
        { seed: SEED + 2, numRuns: 20 * RUNS },
      );
      expect(findings).toEqual([]);
    },
    scaledMs(900_000),
  );

  it.each(['PROPAGATION_PRIVATE', 'PROPAGATION_HOST_TO_CONTAINER'])(
    "a hostPath volume of the host's root (/, %s) mounts read-only, is read in the guest, pins no other container's mounts, and leaves none behind",
    async (propagation) => {
      // The widest host path a request can name: bound recursively into the shared directory (an
      // rshared tree) and served to the guest. Its removal must take every mount it made with it.
      const mounts = async () => mountsUnder(await rt.mountinfo(), rt.dir);
      const before = await mounts();
      // A container made before the volume: its root filesystem's mount is copied by the recursive
      // bind of "/", and its removal must not be pinned by that copy (it was: EBUSY at rmdir).
      // Container names are DNS-1123 subdomains: the enum's name lower-cased, `_` as `-`.
      const tag = propagation.toLowerCase().replaceAll('_', '-');
      const earlier = await create(`earlier-${tag}`);
      const id = await create(`hostroot-${tag}`, {
        mounts: [{ container_path: '/host', host_path: '/', readonly: true, propagation }],
      });
      await rt.cri.runtime.StartContainer({ container_id: id });
      const ls = await rt.cri.runtime.ExecSync({
        container_id: id,
        cmd: ['sh', '-c', 'test -f /host/etc/os-release && echo seen; touch /host/kata-ts-fuzz-write 2>/dev/null || echo refused'],
        timeout: 30,
      });
      expect(ls.stdout.toString()).toBe('seen\nrefused\n');
      await rt.cri.runtime.RemoveContainer({ container_id: earlier });
      await rt.cri.runtime.StopContainer({ container_id: id, timeout: 0 });
      await rt.cri.runtime.RemoveContainer({ container_id: id });
      expect(await mounts()).toEqual(before);
      expect(await fsp.stat('/kata-ts-fuzz-write').catch(() => undefined)).toBeUndefined();
    },
    300_000,
  );

  it(
    'left the pod READY and its container RUNNING and answering; removing it leaves nothing',
    async () => {
      const pod = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid });
      expect(pod.status!.state).toBe('SANDBOX_READY');
      const c = await rt.cri.runtime.ContainerStatus({ container_id: running });
      expect(c.status!.state).toBe('CONTAINER_RUNNING');
      const res = await rt.cri.runtime.ExecSync({
        container_id: running,
        cmd: ['echo', 'still here'],
        timeout: 30,
      });
      expect([res.exit_code, res.stdout.toString()]).toEqual([0, 'still here\n']);
      expect(accepted).toBeGreaterThan(0);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      expect(await leftovers(rt)).toEqual({ processes: [], workDirs: [], records: [], cgroups: [] });
    },
    scaledMs(300_000),
  );
});
