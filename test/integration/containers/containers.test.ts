/**
 * CreateContainer admission, device hot-plug onto planned ports and in-place resize, through the
 * CRI socket of a real daemon with real QEMU (TCG). Three boots: an announced pod (KEP-4112), a pod
 * sized from fallback sources, a confidential pod.
 *
 * No VFIO hardware exists on these machines: the host inventory comes from the fixture tree
 * fixtures/sysfs/gpu-audio (a GPU and its audio function in IOMMU group 12, bound to vfio-pci) and
 * the daemon runs with pcie.simulateVfioWith = "e1000e", so an emulated PCIe NIC takes each
 * vfio-pci function's place through the very same planning, QMP and topology code. Test names say so.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { untilProgress } from '../../helpers/poll.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const FIXTURE = path.join(packageRoot(), 'fixtures', 'sysfs', 'gpu-audio');
const NOTHING = { processes: [], workDirs: [], records: [], cgroups: [] };
const q = (s: string) => ({ string: s });
const res = (requests: Record<string, string>, limits: Record<string, string> = {}) => ({
  requests: Object.fromEntries(Object.entries(requests).map(([k, v]) => [k, q(v)])),
  limits: Object.fromEntries(Object.entries(limits).map(([k, v]) => [k, q(v)])),
});
/** A volume's host path (created by the test, under its runtime's directory). */
let DATA = '';
const GPU_DEVICE = { container_path: '/dev/vfio/12', host_path: '/dev/vfio/12', permissions: 'rw' };

interface SandboxInfo {
  pid: number;
  shape: { vcpus: number; memoryMiB: number; maxVcpus: number; maxMemoryMiB: number };
  qmp: { vcpus: number; baseMemoryMiB: number; pluggedMemoryMiB: number };
  cgroup: Record<string, string>;
  topology: Array<{ id: string; use: string; reservedFor: string | null; occupant: string | null }>;
}

describe('containers in pod VMs', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    const built = await buildImage({ layers: [{ entries: busyboxBaseEntries(), compression: 'gzip' }], cmd: ['/bin/sh'] });
    await new RegistryPusher(registry.url).pushImage('kata/app', '1.0', built);
    image = `${registry.host}/kata/app:1.0`;
    rt = await createTestRuntime({
      images: { registriesConfigPath: '/dev/null' },
      pcie: {
        sysfsRoot: path.join(FIXTURE, 'sys'),
        devRoot: path.join(FIXTURE, 'dev'),
        devNumbersFile: path.join(FIXTURE, 'dev-numbers.json'),
        cdiSpecDirs: [],
        simulateVfioWith: 'e1000e',
      },
    });
    const registries = path.join(rt.dir, 'registries.json');
    await fsp.writeFile(registries, JSON.stringify({ registries: { '127.0.0.1:*': { plainHttp: true } } }));
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { images: Record<string, unknown> };
    cfg.images.registriesConfigPath = registries;
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
    DATA = path.join(rt.dir, 'volumes', 'data');
    await fsp.mkdir(DATA, { recursive: true });
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
  });
  afterEach(async () => {
    // Whatever a failed test left: removed through the CRI, as a kubelet would.
    const { items } = await rt.cri.runtime.ListPodSandbox({});
    for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id });
  });
  afterAll(async () => {
    await rt?.cleanup();
    await registry?.stop();
  });

  async function info(id: string): Promise<SandboxInfo> {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as SandboxInfo;
  }
  function containerConfig(name: string, extra: Record<string, unknown> = {}, attempt = 0): Record<string, unknown> {
    return { metadata: { name, attempt }, image: { image }, labels: { container: name }, log_path: `${name}/${attempt}.log`, ...extra };
  }
  async function create(sandboxId: string, sandboxConfig: object, config: object): Promise<string> {
    return (
      await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sandboxId,
        config,
        sandbox_config: sandboxConfig,
      })
    ).container_id;
  }
  async function occupancy(sid: string): Promise<Array<{ port: string; devices: string[] }>> {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid, verbose: true });
    return (JSON.parse(r.info.info!) as { pci: Array<{ port: string; devices: string[] }> }).pci;
  }

  it('an announced pod: admission, hot-plug onto planned ports (vfio-pci simulated with e1000e: no VFIO hardware), resize within headroom', async () => {
    const sandboxConfig = podConfig(rt, 'announced', {
      pod_resources: {
        containers: [
          {
            name: 'app',
            type: 'REGULAR_CONTAINER',
            kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '500m', memory: '256Mi' }),
            mounts: [{ container_path: '/data', host_path: DATA, readonly: false }],
          },
          { name: 'gpu', type: 'REGULAR_CONTAINER', kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }), devices: [GPU_DEVICE] },
        ],
      },
    });
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig });
    const boot = await info(sid);
    expect(boot.shape).toMatchObject({ vcpus: 1, maxVcpus: 2 });
    const reserved = boot.topology.filter((p) => p.reservedFor !== null).map((p) => [p.id, p.reservedFor]);
    expect(reserved).toEqual([
      ['rp0', '0000:01:00.0'],
      ['rp1', '0000:01:00.1'],
    ]);

    // 1. The announced container, with its quantities spelled differently but equal in value.
    const app = await create(
      sid,
      sandboxConfig,
      containerConfig('app', {
        kubernetes_resources: res({ cpu: '0.25', memory: '134217728' }, { cpu: '500m', memory: '256Mi' }),
        mounts: [{ container_path: '/data', host_path: DATA, readonly: false }],
      }),
    );
    const st = await rt.cri.runtime.ContainerStatus({ container_id: app });
    expect(st.status).toMatchObject({ state: 'CONTAINER_CREATED', metadata: { name: 'app' } });
    expect(st.status!.log_path).toMatch(/\/app\/0\.log$/);
    const list = async (filter: object) => (await rt.cri.runtime.ListContainers({ filter })).containers.map((c) => c.id);
    expect(await list({ pod_sandbox_id: sid })).toEqual([app]);
    expect(await list({ id: app.slice(0, 12), state: { state: 'CONTAINER_CREATED' } })).toEqual([app]);
    expect(await list({ label_selector: { container: 'nope' } })).toEqual([]);
    await expectGrpcError(
      rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: containerConfig('app', {
          kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '500m', memory: '256Mi' }),
          mounts: [{ container_path: '/data', host_path: DATA }],
        }),
      }),
      status.ALREADY_EXISTS,
      'CONTAINER_EXISTS',
    );

    // 2. A changed container: every difference named, and the VM untouched.
    const before = await info(sid);
    const refused = await expectGrpcError(
      rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: containerConfig(
          'app',
          {
            kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '500m', memory: '1Gi' }),
            mounts: [{ container_path: '/data', host_path: DATA, readonly: true }],
          },
          1,
        ),
      }),
      status.FAILED_PRECONDITION,
      'ADMISSION_MISMATCH',
    );
    expect(refused.details).toContain('kubernetes_resources.limits.memory announced 256Mi, received 1Gi');
    expect(refused.details).toContain('mounts["/data"].readonly announced false, received true');
    await expectGrpcError(
      rt.cri.runtime.CreateContainer({ pod_sandbox_id: sid, config: containerConfig('intruder') }),
      status.FAILED_PRECONDITION,
      'ADMISSION_MISMATCH',
    );
    // run_as_group without a user is refused before admission (CRI: the runtime must error).
    await expectGrpcError(
      rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: containerConfig('app', { linux: { security_context: { run_as_group: { value: '1000' } } } }, 1),
      }),
      status.INVALID_ARGUMENT,
      'CONTAINER_RUN_AS_GROUP_WITHOUT_USER',
    );
    const after = await info(sid);
    expect(after.qmp).toEqual(before.qmp);
    expect(after.shape).toEqual(before.shape);
    expect(await list({ pod_sandbox_id: sid })).toEqual([app]);

    // 3. The GPU container: its IOMMU group's two functions go onto the ports reserved for them.
    const gpu = await create(
      sid,
      sandboxConfig,
      containerConfig('gpu', { kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }), devices: [GPU_DEVICE] }),
    );
    const gpuInfo = await rt.cri.runtime.ContainerStatus({ container_id: gpu, verbose: true });
    const attached = (JSON.parse(gpuInfo.info.info!) as { devices: Array<{ qemuId: string; portId: string; driver: string; bdf: string }> })
      .devices;
    expect(attached.map((d) => [d.portId, d.driver, d.bdf])).toEqual([
      ['rp0', 'e1000e', '0000:01:00.0'],
      ['rp1', 'e1000e', '0000:01:00.1'],
    ]);
    // QEMU's own query-pci: each function's stand-in sits behind the port reserved for it.
    const occupied = (await occupancy(sid)).filter((p) => p.devices.length > 0);
    expect(occupied).toEqual([
      { port: 'rp0', devices: [attached[0]!.qemuId] },
      { port: 'rp1', devices: [attached[1]!.qemuId] },
    ]);
    await rt.cri.runtime.RemoveContainer({ container_id: gpu });
    expect((await occupancy(sid)).filter((p) => p.devices.length > 0)).toEqual([]);
    await rt.cri.runtime.RemoveContainer({ container_id: gpu }); // idempotent

    // 4. Resize within the headroom planned at boot: CPU hot-plug and virtio-mem, cgroup limits follow.
    await rt.cri.runtime.UpdateContainerResources({
      container_id: app,
      kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '1', memory: '512Mi' }),
    });
    const grown = await info(sid);
    expect(grown.shape.vcpus).toBe(2);
    expect(grown.qmp.vcpus).toBe(2);
    expect(grown.shape.memoryMiB).toBe(boot.shape.memoryMiB + 256);
    // The guest plugs virtio-mem blocks in its own time (under TCG, after the call has answered).
    const plugged = await untilProgress(
      'the guest to plug the grown memory',
      async () => {
        const { qmp } = await info(sid);
        return {
          done: qmp.baseMemoryMiB + qmp.pluggedMemoryMiB > boot.qmp.baseMemoryMiB ? qmp : undefined,
          progress: qmp.pluggedMemoryMiB,
        };
      },
      60_000,
    );
    expect(plugged.baseMemoryMiB).toBe(boot.qmp.baseMemoryMiB);
    const memoryDir = grown.cgroup['cgroupPath.memory']!;
    const limit = Number((await fsp.readFile(path.join(memoryDir, 'memory.limit_in_bytes'), 'utf8')).trim());
    expect(limit).toBeGreaterThan(grown.shape.memoryMiB * 1024 * 1024);
    const quota = Number((await fsp.readFile(path.join(grown.cgroup['cgroupPath.cpu']!, 'cpu.cfs_quota_us'), 'utf8')).trim());
    expect(quota).toBeGreaterThanOrEqual(200_000);
    // The new announcement is the truth now: the old spelling of "app" would be refused.
    await expectGrpcError(
      rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: containerConfig(
          'app',
          {
            kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '500m', memory: '256Mi' }),
            mounts: [{ container_path: '/data', host_path: DATA }],
          },
          2,
        ),
      }),
      status.FAILED_PRECONDITION,
      'ADMISSION_MISMATCH',
    );

    // 5. Beyond the headroom (memory) or the host (vCPUs): refused with the numbers, nothing changes.
    const e = await expectGrpcError(
      rt.cri.runtime.UpdateContainerResources({
        container_id: app,
        kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '1', memory: '8Gi' }),
      }),
      status.RESOURCE_EXHAUSTED,
      'RESIZE_BEYOND_HEADROOM',
    );
    expect(e.details).toMatch(new RegExp(`MiB exceed the ${grown.shape.maxMemoryMiB} MiB planned at boot`));
    const cpuErr = await expectGrpcError(
      rt.cri.runtime.UpdateContainerResources({
        container_id: app,
        kubernetes_resources: res({ cpu: '250m', memory: '128Mi' }, { cpu: '8', memory: '512Mi' }),
      }),
      status.RESOURCE_EXHAUSTED,
    );
    expect(cpuErr.details).toMatch(/vCPUs/);
    expect((await info(sid)).shape).toEqual(grown.shape);

    // The admitted, resized container runs in the guest (its image's /bin/sh ends at once: no stdin).
    await rt.cri.runtime.StartContainer({ container_id: app });
    // StopContainer of an id that does not exist succeeds, as StopPodSandbox does.
    await rt.cri.runtime.StopContainer({ container_id: 'f'.repeat(64) });
    await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
    const exited = await rt.cri.runtime.ContainerStatus({ container_id: app });
    expect(exited.status!.state).toBe('CONTAINER_EXITED');
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    expect(await list({})).toEqual([]);
    expect(await leftovers(rt)).toEqual(NOTHING);
    expect(await fsp.readdir(path.join(rt.stateDir, 'rootfs')).catch(() => [])).toEqual([]);
  });

  it('a pod sized from fallback sources admits what fits, grows within headroom, refuses beyond', async () => {
    const sandboxConfig = podConfig(rt, 'fallback', {});
    (sandboxConfig.linux as Record<string, unknown>).resources = {
      cpu_period: '100000',
      cpu_quota: '50000',
      memory_limit_in_bytes: String(256 * 1024 * 1024),
    };
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig });
    const boot = await info(sid);
    expect(boot.shape).toMatchObject({ vcpus: 1, maxVcpus: 2 });
    await create(sid, sandboxConfig, containerConfig('small', { kubernetes_resources: res({}, { cpu: '500m', memory: '128Mi' }) }));
    expect((await info(sid)).qmp.vcpus).toBe(1);
    await create(sid, sandboxConfig, containerConfig('second', { kubernetes_resources: res({}, { cpu: '500m', memory: '64Mi' }) }));
    const grown = await info(sid);
    expect(grown.shape.vcpus).toBe(2);
    expect(grown.qmp.vcpus).toBe(2);
    const e = await expectGrpcError(
      rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: containerConfig('huge', { kubernetes_resources: res({}, { cpu: '2' }) }),
      }),
      status.RESOURCE_EXHAUSTED,
      'ADMISSION_BUDGET_EXCEEDED',
    );
    expect(e.details).toMatch(/vCPU/);
    expect((await info(sid)).shape).toEqual(grown.shape);

    // UpdatePodSandboxResources (KEP-1287) with a bigger pod memory limit: virtio-mem grows the VM,
    // vCPUs stay (they never shrink), the VMM's memory limit follows.
    await rt.cri.runtime.UpdatePodSandboxResources({
      pod_sandbox_id: sid,
      resources: { cpu_period: '100000', cpu_quota: '50000', memory_limit_in_bytes: String(512 * 1024 * 1024) },
    });
    const resized = await info(sid);
    expect(resized.shape.vcpus).toBe(2);
    expect(resized.shape.memoryMiB).toBe(boot.shape.memoryMiB + 256);
    const memLimit = Number((await fsp.readFile(path.join(resized.cgroup['cgroupPath.memory']!, 'memory.limit_in_bytes'), 'utf8')).trim());
    expect(memLimit).toBeGreaterThan(resized.shape.memoryMiB * 1024 * 1024);
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    expect(await leftovers(rt)).toEqual(NOTHING);
  });

  it('a confidential pod: devices cold-plugged at boot (vfio-pci simulated with e1000e: no VFIO hardware), never resized', async () => {
    const sandboxConfig = podConfig(rt, 'cvm', {
      pod_resources: {
        containers: [
          { name: 'gpu', type: 'REGULAR_CONTAINER', kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }), devices: [GPU_DEVICE] },
          { name: 'app', type: 'REGULAR_CONTAINER', kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }) },
        ],
      },
    });
    const { pod_sandbox_id: sid } = await rt.cri.runtime.RunPodSandbox({
      config: sandboxConfig,
      runtime_handler: 'kata-ts-cvm',
    });
    const boot = await info(sid);
    expect(boot.shape.maxVcpus).toBe(boot.shape.vcpus);
    expect(boot.shape.maxMemoryMiB).toBe(boot.shape.memoryMiB);
    const pciAtBoot = (await occupancy(sid)).filter((p) => p.devices.length > 0);
    expect(pciAtBoot.map((p) => p.devices.length)).toEqual([1, 1]);
    const gpu = await create(
      sid,
      sandboxConfig,
      containerConfig('gpu', { kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }), devices: [GPU_DEVICE] }),
    );
    await expectGrpcError(
      rt.cri.runtime.UpdateContainerResources({
        container_id: gpu,
        kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }, { cpu: '1', memory: '1Gi' }),
      }),
      status.FAILED_PRECONDITION,
      'RESIZE_CONFIDENTIAL_STATIC',
    );
    expect((await info(sid)).shape).toEqual(boot.shape);
    // The simulated VFIO function (an e1000e) gives the guest no /dev/vfio node: starting the
    // container that asks for one is refused, naming the device, and changes nothing.
    const noNode = await expectGrpcError(rt.cri.runtime.StartContainer({ container_id: gpu }), status.FAILED_PRECONDITION);
    expect(noNode.details).toMatch(/\/dev\/vfio\/12/);
    const stillCreated = await rt.cri.runtime.ContainerStatus({ container_id: gpu });
    expect(stillCreated.status!.state).toBe('CONTAINER_CREATED');
    // Containers run in a confidential pod as in any other: the image's /bin/sh ends at once (no
    // stdin) with exit 0, and the VM keeps its static shape.
    const app = await create(sid, sandboxConfig, containerConfig('app', { kubernetes_resources: res({ cpu: '100m', memory: '64Mi' }) }));
    await rt.cri.runtime.StartContainer({ container_id: app });
    await expect
      .poll(async () => (await rt.cri.runtime.ContainerStatus({ container_id: app })).status, { timeout: scaledMs(60_000), interval: 250 })
      .toMatchObject({ state: 'CONTAINER_EXITED', exit_code: 0 });
    expect((await info(sid)).shape).toEqual(boot.shape);
    await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
    expect(await leftovers(rt)).toEqual(NOTHING);
  });
});
