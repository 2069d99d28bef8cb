/**
 * A secret from the broker to a container, and to no one else, end to end with real parts: the
 * daemon (`kata-ts serve`) in a node network namespace of the test's own with a CNI bridge
 * (test/helpers/network-node.ts), `kata-ts broker serve` in the same namespace listening on the
 * bridge's gateway address (its certificate made by `kata-ts broker init` for that address), and
 * two pods on the `kata-ts-cvm` handler (vtpm here: OVMF, swtpm per pod, TCG) booting a guest
 * built from this tree (the agent with its attester).
 *
 * - Before anything boots, `kata-ts plan --measurements` predicts the good pod's launch; that
 *   prediction is the broker's only reference set, and the policy lets it alone read the
 *   resource. Both pods carry an initdata naming the broker (URL and certificate) and the
 *   annotation `io.kata-ts.secrets` asking, for its container `app`, for the resource at /run/secrets/db-password.
 * - The good pod's container has the file: its sha256, computed in the guest, equals the
 *   secret's (the bytes themselves never travel to the host), mode 0400, read-only.
 * - The other pod's initdata differs by one byte: its container does not start; StartContainer's
 *   error and the container's status name the resource and the mismatching field (PCR 8, where
 *   the guest measured the initdata), and so does the broker's decision log.
 * - The same pod (same initdata) booted after a daemon restart with one more kernel parameter,
 *   with a kernel copy one byte longer, or an initrd copy with zero bytes appended: each is
 *   refused naming the PCR OVMF measured it into (9, 4, 9), never PCR 8 or init_data.
 * - The secret's bytes are nowhere on the host outside the broker's own store: not in the
 *   daemon's state dir (records, the pods' shared directories as the runtime's mount namespace
 *   sees them, while the pods run and after), its log, the broker's log or output, the test's CNI dir.
 *
 * Five boots: the two pods concurrently, then the three launch variants one at a time (the
 * kernel, initrd and command line are the daemon's configuration, not a pod's). Everything the test started is ended by pid; the node namespace and the
 * runtime's temp dir are removed, pass or fail.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { netnsNameFor } from '../../../src/network/index.js';
import { agentGuestDir } from '../../helpers/agent-guest.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createNetworkNode, type NetworkNode } from '../../helpers/network-node.js';
import { kataTsCli, type NodeBroker, startNodeBroker } from '../../helpers/node-broker.js';
import { createTestRuntime, podConfig, pullThenMoveIntoNode, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const HANDLER = 'kata-ts-cvm';
const RESOURCE = 'default/db/password';
const SECRET_PATH = '/run/secrets/db-password';
const APPLETS = ['sleep', 'sha256sum', 'stat', 'cat', 'sh', 'echo'];

/** The guest this tree's agent (with its attester) runs in: KATA_TS_GUEST_DIR, else the tests' agent guest. */
function guestDir(): string {
  const given = process.env.KATA_TS_GUEST_DIR;
  if (given !== undefined) return given;
  const dir = agentGuestDir();
  execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
  return dir;
}

const kataTs = kataTsCli;

/** A Kata-format initdata annotation value: base64 of gzip of the TOML document. */
function initdataAnnotation(doc: string): string {
  return gzipSync(Buffer.from(doc)).toString('base64');
}

describe('pod secrets: released by the broker to the measured pod only (real QEMU, swtpm, OVMF, broker)', () => {
  let node: NetworkNode;
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  let brokerDir: string;
  let broker: NodeBroker | undefined;
  let brokerOut = '';
  let brokerErr = '';
  const sandboxes: string[] = [];
  // Printable, so that a copy in any text (a log line, a record) is found by a plain search.
  const secret = `kata-ts-pod-secret-${randomBytes(24).toString('hex')}`;
  const secretSha256 = createHash('sha256').update(secret).digest('hex');
  let good: { id: string; config: Record<string, unknown> };
  /** The good pod's annotations (its initdata and secrets): the launch variants carry the same. */
  let goodAnnotations: Record<string, string> = {};
  let guest = '';
  let tampered: { id: string; config: Record<string, unknown> };
  let predicted: Record<string, string> = {};
  let goodContainer = '';
  let startError: { code?: number; details?: string } = {};
  let tamperedContainer = '';

  const exec = async (containerId: string, cmd: string[]) => {
    const r = await rt.cri.runtime.ExecSync({ container_id: containerId, cmd, timeout: 30 });
    return { code: r.exit_code, out: Buffer.from(r.stdout).toString('utf8').trim(), err: Buffer.from(r.stderr).toString('utf8').trim() };
  };
  const createApp = async (pod: { id: string; config: Record<string, unknown> }) =>
    (
      await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: pod.id,
        config: { metadata: { name: 'app', attempt: 0 }, image: { image }, command: ['sleep', '3600'], log_path: 'app/0.log' },
        sandbox_config: pod.config,
      })
    ).container_id;
  /** Files under `dirs` (in the runtime's mount namespace: mounts included) that contain `needle`. */
  const filesWith = async (needle: string, dirs: string[]): Promise<string[]> => {
    try {
      const out = await rt.inNamespace(['grep', '-r', '-l', '-a', '-F', '-D', 'skip', '--', needle, ...dirs]);
      return out.split('\n').filter((l) => l !== '');
    } catch (err) {
      // grep: 1 = nothing found; anything else is the search failing, which proves nothing.
      if ((err as { code?: number }).code === 1) return [];
      throw err;
    }
  };

  beforeAll(async () => {
    guest = guestDir();
    node = await createNetworkNode();
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/secrets', '1.0', APPLETS);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      network: node.networkConfig(),
      hypervisor: {
        // Two OVMF boots at once under TCG on a shared machine: the default bound is for one.
        readyTimeoutMs: scaledMs(300_000),
        kernelPath: path.join(guest, 'vmlinuz'),
        initrdPath: path.join(guest, 'initramfs.cpio.gz'),
        guestImagePath: path.join(guest, 'guest.img'),
      },
    });
    await allowLoopbackRegistries(rt);
    await pullThenMoveIntoNode(rt, image, node.netnsPath);

    // The broker, on the gateway address the pods reach it on (made before any pod).
    broker = await startNodeBroker(node, { dir: path.join(rt.dir, 'broker'), tpmCaDir: path.join(rt.dir, 'tpm-ca'), logDir: rt.dir });
    brokerDir = broker.dir;
    brokerOut = broker.stdoutPath;
    brokerErr = broker.stderrPath;
    const { url, certPem } = broker;
    const secretFile = path.join(rt.dir, 'secret.in');
    await fsp.writeFile(secretFile, secret, { mode: 0o600 });
    kataTs(['broker', 'resource', 'set', RESOURCE, '--dir', brokerDir, '--file', secretFile]);
    await fsp.rm(secretFile);

    // Two pods, one byte apart in their initdata; both name the broker and ask for the secret.
    const doc = (note: string) => `version = "0.1.0"
algorithm = "sha256"

[data]
"aa.toml" = '''
[token_configs.kbs]
url = "${url}"
cert = """
${certPem}
"""
'''
"note" = "${note}"
`;
    const annotations = (note: string) => ({
      'io.kata-ts.initdata': initdataAnnotation(doc(note)),
      'io.kata-ts.secrets': JSON.stringify({ app: [{ resource: `kbs:///${RESOURCE}`, path: SECRET_PATH }] }),
    });
    goodAnnotations = annotations('pod-secrets test: good');
    const goodConfig = podConfig(rt, 'secrets-good', { hostname: 'secrets-good', annotations: goodAnnotations });
    const tamperedConfig = podConfig(rt, 'secrets-tampered', {
      hostname: 'secrets-tampered',
      annotations: annotations('pod-secrets test: goof'),
    });

    // The reference set: predicted before the boot from the good pod's request, as an operator would.
    const request = path.join(rt.dir, 'good-request.json');
    await fsp.writeFile(request, JSON.stringify({ config: goodConfig, runtime_handler: HANDLER }));
    const plan = kataTs([
      'plan',
      '--measurements',
      '--request',
      request,
      '--config',
      rt.configPath,
      '--handler',
      HANDLER,
      '--format',
      'json',
    ]);
    const planFile = path.join(rt.dir, 'good-reference.json');
    await fsp.writeFile(planFile, plan);
    predicted = (JSON.parse(plan) as { vtpm?: { pcrs: Record<string, string> } }).vtpm?.pcrs ?? {};
    kataTs(['broker', 'reference', 'add', 'secrets-good', '--dir', brokerDir, '--file', planFile]);
    const policy = path.join(rt.dir, 'policy.json');
    await fsp.writeFile(
      policy,
      JSON.stringify({ schema: 'kata-ts/broker-policy/v1', resources: [{ path: RESOURCE, allow: ['secrets-good'] }] }),
    );
    kataTs(['broker', 'policy', 'set', '--dir', brokerDir, '--file', policy]);

    const run = async (config: Record<string, unknown>) => {
      const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox(
        { config, runtime_handler: HANDLER },
        { deadline: Date.now() + scaledMs(300_000) },
      );
      sandboxes.push(id);
      return { id, config };
    };
    [good, tampered] = await Promise.all([run(goodConfig), run(tamperedConfig)]);

    goodContainer = await createApp(good);
    tamperedContainer = await createApp(tampered);
    await rt.cri.runtime.StartContainer({ container_id: goodContainer }, { deadline: Date.now() + scaledMs(300_000) });
    try {
      await rt.cri.runtime.StartContainer({ container_id: tamperedContainer }, { deadline: Date.now() + scaledMs(300_000) });
    } catch (err) {
      startError = err as { code?: number; details?: string };
    }
  }, scaledMs(900_000));

  afterAll(async () => {
    if (rt !== undefined) {
      // For a failed run's post-mortem: the guests' consoles and the daemon's log, in this test's cache.
      const keep = path.join(repo, '.cache/pod-secrets/last-run');
      await fsp.mkdir(keep, { recursive: true });
      await fsp.copyFile(rt.logFile, path.join(keep, 'daemon.log')).catch(() => undefined);
      for (const id of sandboxes) {
        const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true }).catch(() => undefined);
        const workDir = r === undefined ? null : (JSON.parse(r.info.info ?? '{}') as { workDir?: string | null }).workDir;
        if (typeof workDir === 'string')
          await fsp
            .copyFile(path.join(workDir, 'console.log'), path.join(keep, `${r?.status?.metadata?.name}-console.log`))
            .catch(() => undefined);
      }
      for (const id of sandboxes) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id }).catch(() => undefined);
      await rt.cleanup();
    }
    await broker?.stop();
    await node?.cleanup(sandboxes.map(netnsNameFor));
    await registry?.stop();
  }, scaledMs(180_000));

  it('the prediction made before boot is what the good pod was measured as (its verbose status)', async () => {
    expect(Object.keys(predicted)).toEqual(['4', '7', '8', '9']);
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: good.id, verbose: true });
    const info = JSON.parse(r.info.info!) as { referenceValues: { vtpm?: { pcrs: Record<string, string> } } };
    expect(info.referenceValues.vtpm?.pcrs).toEqual(predicted);
  });

  it("the good pod's container reads the secret: same sha256 (computed in the guest), 0400, read-only", async () => {
    const sum = await exec(goodContainer, ['sha256sum', SECRET_PATH]);
    expect(sum.code).toBe(0);
    expect(sum.out.split(/\s+/)[0]).toBe(secretSha256);
    expect(await exec(goodContainer, ['stat', '-c', '%a %u', SECRET_PATH])).toMatchObject({ code: 0, out: '400 0' });
    const write = await exec(goodContainer, ['sh', '-c', `echo x > ${SECRET_PATH}`]);
    expect(write.code).not.toBe(0);
    expect(write.err).toMatch(/Read-only file system/);
    expect((await exec(goodContainer, ['sha256sum', SECRET_PATH])).out.split(/\s+/)[0]).toBe(secretSha256);
  });

  it('the pod one initdata byte apart does not start: the error and its status name the resource and PCR 8', async () => {
    // FAILED_PRECONDITION (9): the broker did not release the resource to this pod.
    expect(startError.code).toBe(9);
    expect(startError.details).toContain(`resource kbs:///${RESOURCE} for ${SECRET_PATH} was not released`);
    expect(startError.details).toMatch(/tpm_pcr8/);
    expect(startError.details).not.toMatch(/tpm_pcr9|tpm_pcr4|tpm_pcr7/);
    const { status } = await rt.cri.runtime.ContainerStatus({ container_id: tamperedContainer });
    expect(status?.state).toBe('CONTAINER_CREATED');
    expect(status?.reason).toBe('SecretNotReleased');
    expect(status?.message).toContain(`kbs:///${RESOURCE}`);
    expect(status?.message).toMatch(/tpm_pcr8/);
    // The good pod's container runs on.
    expect((await rt.cri.runtime.ContainerStatus({ container_id: goodContainer })).status?.state).toBe('CONTAINER_RUNNING');
  });

  it("the broker's decision log names the mismatch for the tampered pod, and the release to the good one", async () => {
    const lines = (await fsp.readFile(path.join(brokerDir, 'decisions.log'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const refused = lines.filter((l) => l.event === 'attest' && l.outcome === 'refused');
    expect(refused.length).toBeGreaterThan(0);
    expect(refused.some((l) => JSON.stringify(l).includes('tpm_pcr8'))).toBe(true);
    expect(lines.some((l) => l.event === 'resource' && l.outcome === 'released' && JSON.stringify(l).includes(RESOURCE))).toBe(true);
  });

  it(
    'the same pod booted with one byte more on the command line, the kernel or the initrd is refused, naming the PCR',
    async () => {
      const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { hypervisor: Record<string, unknown> };
      const original = { ...cfg.hypervisor };
      // Copies of the guest's kernel with one byte appended and its initrd with zero bytes
      // appended (gzip members end where they end; the kernel reads past trailing zeros).
      const kernelCopy = path.join(rt.dir, 'vmlinuz.plus1');
      await fsp.writeFile(kernelCopy, Buffer.concat([await fsp.readFile(path.join(guest, 'vmlinuz')), Buffer.from([0])]));
      const initrdCopy = path.join(rt.dir, 'initramfs.plus-zeros.cpio.gz');
      await fsp.writeFile(initrdCopy, Buffer.concat([await fsp.readFile(path.join(guest, 'initramfs.cpio.gz')), Buffer.alloc(512)]));
      const variants: Array<{ name: string; hypervisor: Record<string, unknown>; pcr: string }> = [
        { name: 'cmdline', hypervisor: { kernelParams: ['kata_ts_test.extra=1'] }, pcr: 'tpm_pcr9' },
        { name: 'kernel', hypervisor: { kernelPath: kernelCopy }, pcr: 'tpm_pcr4' },
        { name: 'initrd', hypervisor: { initrdPath: initrdCopy }, pcr: 'tpm_pcr9' },
      ];
      const outcomes: Record<string, { code?: number; details?: string }> = {};
      try {
        for (const v of variants) {
          // The host's launch configuration changes under a daemon restart; the running pods stay.
          await rt.stop();
          await fsp.writeFile(rt.configPath, JSON.stringify({ ...cfg, hypervisor: { ...original, ...v.hypervisor } }));
          await rt.start();
          const config = podConfig(rt, `secrets-${v.name}`, { hostname: `secrets-${v.name}`, annotations: goodAnnotations });
          const { pod_sandbox_id: id } = await rt.cri.runtime.RunPodSandbox(
            { config, runtime_handler: HANDLER },
            { deadline: Date.now() + scaledMs(300_000) },
          );
          sandboxes.push(id);
          const cid = await createApp({ id, config });
          outcomes[v.name] = await rt.cri.runtime.StartContainer({ container_id: cid }, { deadline: Date.now() + scaledMs(300_000) }).then(
            () => ({ code: 0 }),
            (err: { code?: number; details?: string }) => ({ code: err.code, details: err.details }),
          );
          // Its pod is done with: one variant's VM at a time.
          await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
        }
      } finally {
        await rt.stop();
        await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
        await rt.start();
      }
      for (const v of variants) {
        const o = outcomes[v.name];
        expect({ variant: v.name, code: o?.code }).toEqual({ variant: v.name, code: 9 });
        expect(o?.details).toContain(`resource kbs:///${RESOURCE} for ${SECRET_PATH} was not released`);
        expect(o?.details).toContain(v.pcr);
        // The initdata is the good pod's: PCR 8 and init_data match.
        expect(o?.details).not.toMatch(/tpm_pcr8|init_data/);
      }
    },
    scaledMs(1_200_000),
  );

  it("the secret's bytes are nowhere on the host but the broker's store: state dir, shared dirs, records, logs, outputs", async () => {
    const base64 = Buffer.from(secret).toString('base64');
    // While the pods run: the state dir as the runtime's mount namespace sees it (the pods'
    // shared directories with the containers' root filesystems mounted in them).
    const places = [rt.stateDir, rt.logFile, brokerOut, brokerErr, path.join(brokerDir, 'decisions.log'), node.dir];
    expect(await filesWith(secret, places)).toEqual([]);
    expect(await filesWith(base64, places)).toEqual([]);
    // The search finds what is there (it is not blind): the broker's own store holds it.
    expect((await filesWith(secret, [brokerDir])).length).toBeGreaterThan(0);
    // And after the pods are gone.
    for (const id of sandboxes.splice(0)) {
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: id });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: id });
    }
    expect(await filesWith(secret, places)).toEqual([]);
    const daemonLog = await fsp.readFile(rt.logFile, 'utf8');
    expect(daemonLog).not.toContain(secret);
    // The daemon did log the refusal (names only): the search above looked at the right file.
    expect(daemonLog).toContain(`kbs:///${RESOURCE}`);
  });
});
