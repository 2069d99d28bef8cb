/**
 * An upgraded daemon and a pod whose agent speaks the previous API, with real parts: the guest
 * (kernel, init, agent) is built from git history at the last commit of the previous API
 * (API_BASELINES, test/helpers/previous-agent.ts), the daemon is this tree's (`kata-ts serve`),
 * the pod runs on `kata-ts-cvm` (vtpm: OVMF and swtpm, TCG) so that it may ask for secrets.
 *
 * - The session runs at the older API, and the sandbox's verbose status and the daemon's log say
 *   so, with the feature refused (secrets).
 * - A container is created, started and exec'd into as on a current agent.
 * - A container the pod asks secrets for does not start: StartContainer fails with
 *   FAILED_PRECONDITION naming secrets and the agent's API, the container stays CREATED and
 *   nothing of it runs in the guest (the pod's shared PID namespace, seen from the first
 *   container). The first container keeps running and answering exec; the refused one is removed.
 *
 * One boot. Skipped with a notice when the checkout lacks the baseline commit (a shallow clone).
 */
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_API_FEATURES, API_BASELINES } from '../../../src/agent-client/index.js';
import { AGENT_API_VERSION } from '../../../src/generated/agent/agent.js';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { ensurePreviousAgentGuest, haveCommit } from '../../helpers/previous-agent.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const HANDLER = 'kata-ts-cvm';
const OLDER = AGENT_API_VERSION - 1;
/** What the older agent lacks, as the host's table lists it (secrets, and whatever came with them). */
const MISSING = AGENT_API_FEATURES.filter((f) => f.since > OLDER).map((f) => f.feature);
const BASELINE = API_BASELINES[OLDER] ?? '';
const AVAILABLE = BASELINE !== '' && haveCommit(BASELINE);
if (!AVAILABLE)
  console.warn(`agent-compat: this checkout lacks commit ${BASELINE || `(no baseline for API ${OLDER})`} (a shallow clone?): skipped`);

/** An initdata naming a broker nobody serves: enough for the host to let the pod ask for secrets. */
const INITDATA = `version = "0.1.0"
algorithm = "sha256"

[data]
"aa.toml" = '''
[token_configs.kbs]
url = "https://192.0.2.1:8443"
'''
`;

describe.skipIf(!AVAILABLE)(`a pod on an agent of the previous API (${OLDER}) under this daemon (API ${AGENT_API_VERSION})`, () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image = '';
  let podId = '';
  let plain = '';
  let withSecrets = '';
  let startError: { code?: number; details?: string } = {};

  const exec = async (containerId: string, cmd: string[]) => {
    const r = await rt.cri.runtime.ExecSync({ container_id: containerId, cmd, timeout: 60 });
    return { code: r.exit_code, out: Buffer.from(r.stdout).toString('utf8').trim() };
  };

  beforeAll(async () => {
    const guest = ensurePreviousAgentGuest(BASELINE);
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/compat', '1.0', ['sleep', 'echo', 'sh', 'cat']);
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      hypervisor: {
        readyTimeoutMs: scaledMs(300_000),
        kernelPath: guest.kernelPath,
        initrdPath: guest.initrdPath,
        guestImagePath: guest.guestImagePath,
      },
    });
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const config = podConfig(rt, 'compat', {
      hostname: 'compat',
      annotations: {
        'io.kata-ts.initdata': gzipSync(Buffer.from(INITDATA)).toString('base64'),
        'io.kata-ts.secrets': JSON.stringify({ 'secret-app': [{ resource: 'kbs:///default/db/password', path: '/run/secrets/p' }] }),
      },
    });
    // One PID namespace for the pod (shareProcessNamespace), so that a container sees the pod's processes.
    const shared = { namespace_options: { network: 'POD', pid: 'POD', ipc: 'POD' } as const };
    (config.linux as Record<string, unknown>).security_context = shared;
    podId = (await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: HANDLER }, { deadline: Date.now() + scaledMs(300_000) }))
      .pod_sandbox_id;
    const create = async (name: string) =>
      (
        await rt.cri.runtime.CreateContainer({
          pod_sandbox_id: podId,
          config: {
            metadata: { name, attempt: 0 },
            image: { image },
            command: ['sleep', '3600'],
            log_path: `${name}/0.log`,
            linux: { security_context: shared },
          },
          sandbox_config: config,
        })
      ).container_id;
    plain = await create('app');
    await rt.cri.runtime.StartContainer({ container_id: plain }, { deadline: Date.now() + scaledMs(120_000) });
    withSecrets = await create('secret-app');
    try {
      await rt.cri.runtime.StartContainer({ container_id: withSecrets }, { deadline: Date.now() + scaledMs(120_000) });
    } catch (err) {
      startError = err as { code?: number; details?: string };
    }
  }, scaledMs(900_000));

  afterAll(async () => {
    if (rt !== undefined) {
      if (podId !== '') {
        await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
        await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: podId }).catch(() => undefined);
      }
      await rt.cleanup();
    }
    await registry?.stop();
  }, scaledMs(180_000));

  it('runs the session at the older API and says so in the verbose status and the log', async () => {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: podId, verbose: true });
    const info = JSON.parse(r.info.info!) as { agent: Record<string, unknown> };
    expect(MISSING).toContain('secrets');
    expect(info.agent).toMatchObject({
      connected: true,
      apiVersion: OLDER,
      hostApiVersion: AGENT_API_VERSION,
      missingFeatures: MISSING,
    });
    const lines = await rt.logLines();
    const started = lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith(`agent session started at the previous API ${OLDER}`));
    expect(started).toMatchObject({ apiVersion: OLDER, hostApiVersion: AGENT_API_VERSION, refusedFeatures: MISSING });
  });

  it('creates, starts and execs a container as on a current agent', async () => {
    expect((await rt.cri.runtime.ContainerStatus({ container_id: plain })).status?.state).toBe('CONTAINER_RUNNING');
    expect(await exec(plain, ['echo', 'hello from the older agent'])).toEqual({ code: 0, out: 'hello from the older agent' });
  });

  it("refuses the container that needs secrets before the agent sees it, naming the feature and the agent's API", async () => {
    expect(startError.code).toBe(9);
    expect(startError.details).toContain(`the pod's agent speaks API ${OLDER}, which has no secrets`);
    const { status } = await rt.cri.runtime.ContainerStatus({ container_id: withSecrets });
    expect(status?.state).toBe('CONTAINER_CREATED');
    // Nothing of it runs in the guest: the pod shares one PID namespace, where the first
    // container sees every process of the pod; an agent that had taken the request without its
    // secrets would have a second `sleep` (or crun's waiting init) there.
    const comms = (await exec(plain, ['sh', '-c', 'cat /proc/[0-9]*/comm'])).out.split('\n');
    expect(comms.filter((c) => c === 'sleep')).toHaveLength(1);
    expect(comms.filter((c) => c.startsWith('crun') || c === '3')).toEqual([]);
    const lines = await rt.logLines();
    expect(JSON.stringify(lines)).toContain('AGENT_API_FEATURE_MISSING');
  });

  it('keeps the pod working after the refusal', async () => {
    expect((await rt.cri.runtime.ContainerStatus({ container_id: plain })).status?.state).toBe('CONTAINER_RUNNING');
    expect(await exec(plain, ['echo', 'still here'])).toEqual({ code: 0, out: 'still here' });
    const { containers } = await rt.cri.runtime.ListContainers({});
    expect(containers.map((c) => c.id).sort()).toEqual([plain, withSecrets].sort());
    // The refused container goes as any other.
    await rt.cri.runtime.RemoveContainer({ container_id: withSecrets });
    expect((await rt.cri.runtime.ListContainers({})).containers.map((c) => c.id)).toEqual([plain]);
  });
});
