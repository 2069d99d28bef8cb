/**
 * VM templates on real QEMU 7.2 (TCG): one template boot with the real guest and agent, two
 * clones restored from it, one cold boot of the same shape for comparison. What it proves:
 * - the template's device state is saved without its RAM (x-ignore-shared) and its RAM file is
 *   read-only afterwards;
 * - each clone's agent answers without a boot (the guest's uptime runs on from the template's)
 *   and runs something (CreatePod starts the pod's pause process in the guest);
 * - a clone is ready only once reseeded: the two clones' kernels then hand out different bytes
 *   and each one's wall clock is the host's;
 * - a clone's 9p share is mounted by its agent at the shared dir and a container runs from a
 *   rootfs on it;
 * - the clones share the RAM file's pages (Pss < Rss of the file mapping in each QEMU) and keep
 *   their writes private (a marker written in one guest is in its memory only, not in the other
 *   clone's nor in the template's file);
 * - a template whose key differs, or whose state was altered, is refused before any QEMU starts;
 * - what QEMU 7.2 does when vhost-user-fs is hot-plugged into a clone: virtiofsd is handed the
 *   template's RAM file (docs/templates.md, the virtio-fs decision).
 * Timings and PSS are printed (TEMPLATE_NUMBERS), never asserted: speed is the bench's.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../src/agent-client/index.js';
import { silentLogger } from '../../src/common/logger.js';
import { packageVersion } from '../../src/common/paths.js';
import { buildQemuArgv } from '../../src/hypervisor/argv.js';
import { CLAIM_VFS_DEVICE_ID, plugSharedFs } from '../../src/hypervisor/claim-hotplug.js';
import { startVm, type VmProcess, vmPaths } from '../../src/hypervisor/launcher.js';
import { planClone9pDevice, type TemplateKey, type TemplateVmSpec, templatePaths } from '../../src/hypervisor/template.js';
import { buildTemplate, computeTemplateKey, fileSha256, startClone } from '../../src/hypervisor/template-execute.js';
import { startVirtiofsd, type VirtiofsdProcess } from '../../src/hypervisor/virtiofsd.js';
import { type ReseedResult, reseedClone, startReadyClone } from '../../src/runtime/template/clone.js';
import { ensureAgentGuest } from '../helpers/agent-guest.js';
import { guestProbeSpec } from '../helpers/guest-oci-spec.js';
import { QemuTracker } from '../helpers/hypervisor-guest.js';
import { until } from '../helpers/poll.js';
import { scaledMs } from '../helpers/time-scale.js';

const logger = silentLogger();
const QEMU = 'qemu-system-x86_64';
const MEMORY_MIB = 512;

async function agentReady(socketPath: string, timeoutMs: number): Promise<AgentClient> {
  return AgentClient.connect({ socketPath, logger, hostVersion: packageVersion() }, timeoutMs);
}

/** Rss and Pss (KiB) of the mappings of `file` in process `pid`. */
function mappingMemory(pid: number, file: string): { rssKiB: number; pssKiB: number; mappings: number } {
  const lines = readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n');
  let inside = false;
  const out = { rssKiB: 0, pssKiB: 0, mappings: 0 };
  for (const line of lines) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) {
      inside = line.trimEnd().endsWith(` ${file}`);
      if (inside) out.mappings += 1;
      continue;
    }
    if (!inside) continue;
    const m = /^(Rss|Pss):\s+(\d+) kB/.exec(line);
    if (m?.[1] === 'Rss') out.rssKiB += Number(m[2]);
    if (m?.[1] === 'Pss') out.pssKiB += Number(m[2]);
  }
  return out;
}

/** The whole process's PSS (KiB). */
function processPssKiB(pid: number): number {
  const m = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
  return Number(m?.[1] ?? Number.NaN);
}

/** Dump the guest's physical RAM (boot RAM at 0; the 32-bit hole left out) and tell whether `needle` is in it. */
async function guestMemoryHolds(vm: VmProcess, dumpFile: string, needle: string): Promise<boolean> {
  // q35 maps the first 2 GiB of RAM below 4 GiB: a 512 MiB guest is all at [0, 512 MiB).
  await vm.qmp.execute('pmemsave', { val: 0, size: MEMORY_MIB * 1024 * 1024, filename: dumpFile }, { timeoutMs: 60_000 });
  try {
    return (await fsp.readFile(dumpFile)).includes(Buffer.from(needle));
  } finally {
    await fsp.rm(dumpFile, { force: true });
  }
}

/** Another reseed of a ready clone: its urandom sample. */
async function reseedSample(agent: AgentClient): Promise<Uint8Array> {
  return (await reseedClone(agent, scaledMs(30_000))).answer.urandomSample;
}

function fileHolds(file: string, needle: string): boolean {
  return readFileSync(file).includes(Buffer.from(needle));
}

describe('VM templates: a template, two clones, a cold boot (QEMU 7.2, TCG)', () => {
  const tracker = new QemuTracker();
  const shmDir = path.join('/dev/shm', `kata-ts-template-test-${randomBytes(4).toString('hex')}`);
  const templateDir = path.join(shmDir, 'tpl');
  const numbers: Record<string, number> = {};
  const clients: AgentClient[] = [];
  let spec: TemplateVmSpec;
  let key: TemplateKey;
  const clones: Array<{ vm: VmProcess; agent: AgentClient }> = [];
  let virtiofsd: VirtiofsdProcess | undefined;
  const instances: string[] = [];
  let templateUptime = 0;
  let savedAtMs = 0;

  beforeAll(async () => {
    const guest = ensureAgentGuest();
    await fsp.mkdir(shmDir, { mode: 0o700 });
    spec = {
      shape: { vcpus: 1, maxVcpus: 2, memoryMiB: MEMORY_MIB, maxMemoryMiB: 1024, hugepages: [], kernelParams: [] },
      accel: 'tcg',
      kernelPath: guest.kernelPath,
      initrdPath: guest.initrdPath,
      guestImagePath: guest.guestImagePath,
      kernelParams: [],
      // One spare PCIe port, as a pooled VM has for the pod's virtio-fs.
      pcieArgs: ['-device', 'pcie-root-port,id=rp0,bus=pcie.0,addr=08.0,chassis=1,slot=1,port=1,io-reserve=0'],
      confidential: false,
      withAgent: true,
    };
    key = await computeTemplateKey(QEMU, spec);
  }, 600_000);

  afterAll(async () => {
    for (const c of clients) c.close();
    await virtiofsd?.stop().catch(() => undefined);
    await tracker.cleanup();
    await fsp.rm(shmDir, { recursive: true, force: true });
    console.log(`TEMPLATE_NUMBERS ${JSON.stringify(numbers)}`);
  });

  it('builds a template: device state saved without RAM, RAM file read-only, record beside them', async () => {
    const workDir = tracker.workDir();
    const started = Date.now();
    const record = await buildTemplate({
      qemuBinary: QEMU,
      spec,
      key,
      templateDir,
      workDir,
      logger,
      waitAgentReady: async (socket, vm) => {
        tracker.track(vm);
        const agent = await agentReady(socket, scaledMs(180_000));
        // Hello answered: the agent is up. Let go of the socket so the clones' first dial is theirs.
        templateUptime = (await agent.guestFacts({ timeoutMs: scaledMs(30_000) })).uptimeSeconds;
        savedAtMs = Date.now();
        agent.close();
      },
    });
    numbers.templateBuildMs = Date.now() - started;
    const files = templatePaths(templateDir);
    expect(record.key).toEqual(key);
    expect((await fsp.stat(files.ramFile)).mode & 0o777).toBe(0o444);
    expect(record.ramBytes).toBe(MEMORY_MIB * 1024 * 1024);
    // x-ignore-shared: the RAM is not in the stream (a few MiB of device state at most).
    expect(record.stateBytes).toBeLessThan(8 * 1024 * 1024);
    numbers.stateBytes = record.stateBytes;
    expect(await fileSha256(files.stateFile)).toBe(record.stateSha256);
  }, 600_000);

  it('two clones: each agent answers without a boot and runs the pod; they share the RAM file and keep their writes', async () => {
    const files = templatePaths(templateDir);
    const templateRamSha = await fileSha256(files.ramFile);
    const reseeds: ReseedResult[] = [];
    for (const name of ['clone-a', 'clone-b']) {
      const workDir = tracker.workDir();
      // Restore, agent, reseed: the clone is ready only once its reseed answered and was checked.
      const ready = await startReadyClone(
        {
          qemuBinary: QEMU,
          spec,
          key,
          templateDir,
          workDir,
          name,
          logger,
          hostVersion: packageVersion(),
          agentTimeoutMs: scaledMs(60_000),
        },
        logger,
      );
      const { vm, agent } = ready;
      tracker.track(vm);
      clients.push(agent);
      numbers[`${name}RestoreMs`] = ready.restoreMs;
      numbers[`${name}ReadyMs`] = ready.readyMs;
      numbers[`${name}ClockBehindMs`] = Math.round(ready.reseed.clockBehindMs);
      clones.push({ vm, agent });
      reseeds.push(ready.reseed);
      instances.push(agent.connection.hello?.agentInstanceId ?? '');
    }
    // Reseeded: the two clones' kernels hand out different bytes (same template, same CRNG key
    // before the reseed), and each clone's wall clock is the host's: read after the set, it lies
    // between the host's clock when the request left and when the answer came back.
    const [ra, rb] = reseeds;
    expect(ra!.answer.urandomSample.length).toBe(16);
    expect(Buffer.from(ra!.answer.urandomSample).equals(Buffer.from(rb!.answer.urandomSample))).toBe(false);
    for (const r of reseeds) {
      const afterMs = r.answer.guestTimeAfter!.seconds * 1000 + r.answer.guestTimeAfter!.nanos / 1e6;
      expect(afterMs).toBeGreaterThanOrEqual(Math.floor(r.sentMs));
      // A guest clock running a little fast over the call: 1 s at most.
      expect(afterMs).toBeLessThanOrEqual(r.receivedMs + 1000);
    }
    // The same clone asked again draws new bytes (its CRNG runs on, it does not replay).
    const again = await reseedSample(clones[0]!.agent);
    expect(Buffer.from(again).equals(Buffer.from(ra!.answer.urandomSample))).toBe(false);
    // The same agent process answers in both (its instance id was drawn in the template before
    // the save): everything the guest drew before the save is shared by every clone.
    expect(instances[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(instances[1]).toBe(instances[0]);
    // No boot: the guest's clock of uptime runs on from the template's (which booted for many seconds).
    for (const { agent } of clones) {
      const facts = await agent.guestFacts({ timeoutMs: scaledMs(30_000) });
      expect(facts.onlineVcpus).toBe(1);
      expect(facts.uptimeSeconds).toBeGreaterThanOrEqual(templateUptime);
      // The guest's clock runs on from the save, not from now: the seconds between the save and
      // the clone never happened for it (why a clone must have its clock set after restore).
      const wallSinceSaveS = (Date.now() - savedAtMs) / 1000;
      numbers.cloneClockBehindS = Math.round(templateUptime + wallSinceSaveS - facts.uptimeSeconds);
      expect(facts.uptimeSeconds).toBeLessThan(templateUptime + wallSinceSaveS);
    }
    // Each runs something: CreatePod starts the pod's pause process in that guest. The pod ids
    // are the markers: they end up in the guest's memory (agent heap, tmpfs file, hostname).
    const markers = [`tplmarkA${randomBytes(6).toString('hex')}`, `tplmarkB${randomBytes(6).toString('hex')}`];
    const pods = await Promise.all(
      clones.map(({ agent }, i) => agent.createPod({ podId: markers[i]!, hostname: markers[i]! }, { timeoutMs: scaledMs(60_000) })),
    );
    for (const pod of pods) expect(pod.pausePid).toBeGreaterThan(1);

    // Shared pages: each QEMU maps the RAM file, and part of what it has resident is shared.
    const [a, b] = clones.map(({ vm }) => mappingMemory(vm.pid, files.ramFile));
    expect(a!.mappings).toBe(1);
    expect(b!.mappings).toBe(1);
    expect(a!.rssKiB).toBeGreaterThan(0);
    expect(a!.pssKiB).toBeLessThan(a!.rssKiB);
    expect(b!.pssKiB).toBeLessThan(b!.rssKiB);
    Object.assign(numbers, {
      cloneARamRssKiB: a!.rssKiB,
      cloneARamPssKiB: a!.pssKiB,
      cloneBRamRssKiB: b!.rssKiB,
      cloneBRamPssKiB: b!.pssKiB,
      cloneAPssKiB: processPssKiB(clones[0]!.vm.pid),
      cloneBPssKiB: processPssKiB(clones[1]!.vm.pid),
    });

    // Private writes: each marker is in its own guest's memory only, and never in the template's file.
    const dump = path.join(shmDir, 'dump');
    expect(await guestMemoryHolds(clones[0]!.vm, dump, markers[0]!)).toBe(true);
    expect(await guestMemoryHolds(clones[1]!.vm, dump, markers[1]!)).toBe(true);
    expect(await guestMemoryHolds(clones[1]!.vm, dump, markers[0]!)).toBe(false);
    expect(await guestMemoryHolds(clones[0]!.vm, dump, markers[1]!)).toBe(false);
    expect(fileHolds(files.ramFile, markers[0]!)).toBe(false);
    expect(fileHolds(files.ramFile, markers[1]!)).toBe(false);
    expect(await fileSha256(files.ramFile)).toBe(templateRamSha);
  }, 600_000);

  it('refuses a template whose key differs or whose state was altered, before any QEMU starts', async () => {
    const workDir = tracker.workDir();
    const other = { ...key, kernelSha256: 'f'.repeat(64) };
    await expect(startClone({ qemuBinary: QEMU, spec, key: other, templateDir, workDir, name: 'clone-x', logger })).rejects.toMatchObject({
      reason: 'TEMPLATE_KEY_MISMATCH',
      message: expect.stringContaining('kernelSha256'),
    });
    // A copy of the template whose state has one byte changed.
    const files = templatePaths(templateDir);
    const tampered = templatePaths(path.join(shmDir, 'tampered'));
    await fsp.mkdir(tampered.dir);
    await fsp.copyFile(files.recordFile, tampered.recordFile);
    await fsp.link(files.ramFile, tampered.ramFile);
    const state = await fsp.readFile(files.stateFile);
    state[state.length >> 1]! ^= 0xff;
    await fsp.writeFile(tampered.stateFile, state);
    await expect(
      startClone({ qemuBinary: QEMU, spec, key, templateDir: tampered.dir, workDir, name: 'clone-y', logger }),
    ).rejects.toMatchObject({ reason: 'TEMPLATE_STATE_CORRUPT' });
    // Neither attempt started QEMU: its work dir has no QMP socket or log.
    await expect(fsp.access(vmPaths(workDir).qemuLog)).rejects.toThrow();
  }, 120_000);

  it('vhost-user-fs hot-plugged into a clone does not work on QEMU 7.2: virtiofsd sees the template file, not the clone', async () => {
    const files = templatePaths(templateDir);
    const clone = clones[0]!;
    const source = path.join(shmDir, 'share');
    await fsp.mkdir(source);
    await fsp.writeFile(path.join(source, 'hello.txt'), 'from the host\n');
    const workDir = tracker.workDir();
    const socketPath = path.join(workDir, 'vfs.sock');
    virtiofsd = await startVirtiofsd({ socketPath, sourceDir: source, logFile: path.join(workDir, 'virtiofsd.log'), logger });
    const before = await fileSha256(files.ramFile);
    // Sample what virtiofsd maps from the plug on: it may not live long.
    const backendMaps = new Set<string>();
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        for (const pid of virtiofsd!.pids()) {
          try {
            for (const l of readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n')) {
              if (l.includes(shmDir) || l.includes('memfd:')) backendMaps.add(l.replace(/^\S+\s+/, ''));
            }
          } catch {
            // exited meanwhile
          }
        }
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    await plugSharedFs(clone.vm.qmp, socketPath, 'rp0');
    expect(JSON.stringify(await clone.vm.qmp.execute('query-pci'))).toContain(CLAIM_VFS_DEVICE_ID);
    // The guest probes the device; CreatePod waits for it and mounts it (or gives up after 15 s).
    // Only when the guest's driver starts the device does QEMU send virtiofsd its memory table:
    // an fd per RAM region, for the clone's boot RAM the template's file, which virtiofsd maps
    // shared. It then reads the virtqueues the guest wrote into its private copy from the
    // template's pages instead, sees nonsense and gives up.
    const pod = await clone.agent
      .createPod({ podId: 'vfsprobe', hostname: 'vfsprobe' }, { timeoutMs: scaledMs(40_000) })
      .then((r) => ({ mounted: r.sharedDirMounted }))
      .catch((err: unknown) => ({ error: String(err) }));
    // A read of a host file through the share: never served (virtiofsd polls a ring the guest
    // never wrote, or has panicked on it), so it times out or fails.
    const read = await clone.agent
      .statSharedPath({ relativePath: 'hello.txt', readContent: true }, { timeoutMs: scaledMs(20_000) })
      .then((r) => ({ content: Buffer.from(r.content ?? []).toString() }))
      .catch((err: unknown) => ({ error: String(err).slice(0, 200) }));
    sampling = false;
    await sampler;
    const log = await fsp.readFile(path.join(workDir, 'virtiofsd.log'), 'utf8');
    const after = await fileSha256(files.ramFile);
    console.log(
      `TEMPLATE_VHOST_USER_FS ${JSON.stringify({ pod, read, templateRamChanged: before !== after, backendMaps: [...backendMaps], virtiofsdLog: log.slice(-500) })}`,
    );
    // virtiofsd mapped the template's file shared and writable, and gave up on the nonsense it
    // read there (or polls it for ever). The guest's mount may return (FUSE_INIT is answered
    // asynchronously); what it never gets is an answer.
    // The mapping is seen when the sampler runs before virtiofsd panics (three runs of five);
    // the panic, on the nonsense read from the template's page, when it happens (four of five).
    const mappedTemplate = [...backendMaps].some((l) => l.startsWith('rw-s') && l.endsWith(files.ramFile));
    expect(mappedTemplate || /fv_panic: libvhost-user: Guest moved used index/.test(log)).toBe(true);
    expect(read).not.toEqual({ content: 'from the host\n' });
  }, 180_000);

  it('a clone with a 9p share: the device hot-plugged, the agent mounts it at the shared dir, a container runs from a rootfs on it', async () => {
    const workDir = tracker.workDir();
    // On disk beside the clone's files, as a sandbox's shared dir is.
    const source = path.join(workDir, 'shared');
    await fsp.mkdir(source);
    await fsp.writeFile(path.join(source, 'hello.txt'), 'from the host over 9p\n');
    // A busybox root filesystem for a probe container, as the container layer shares one.
    const rootfs = path.join(source, 'containers', 'probe', 'rootfs');
    await fsp.mkdir(path.join(rootfs, 'bin'), { recursive: true });
    for (const dir of ['proc', 'dev', 'sys', 'tmp']) await fsp.mkdir(path.join(rootfs, dir));
    await fsp.copyFile('/bin/busybox', path.join(rootfs, 'bin', 'busybox'));
    await fsp.chmod(path.join(rootfs, 'bin', 'busybox'), 0o755);
    const { vm, agent } = await startReadyClone(
      {
        qemuBinary: QEMU,
        spec,
        key,
        templateDir,
        workDir,
        name: 'clone-9p',
        logger,
        share: { hostDir: source, securityModel: 'mapped-xattr' },
        hostVersion: packageVersion(),
        agentTimeoutMs: scaledMs(60_000),
      },
      logger,
    );
    tracker.track(vm);
    clients.push(agent);
    await vm.qmp.execute('device_add', planClone9pDevice('rp0'));
    // QEMU serves 9p itself through its own (private) mapping of the guest's RAM: the guest's
    // virtio driver accepts the device (DRIVER_OK) without any other process mapping that RAM.
    const qomPath = await until('the 9p device listed as a virtio device', async () => {
      const devices = await vm.qmp.execute<Array<{ path: string; name: string }>>('x-query-virtio');
      return devices.find((d) => d.name === 'virtio-9p')?.path;
    });
    // CreatePod waits for the hot-plugged device and mounts it where virtio-fs would be.
    const pod = await agent.createPod({ podId: 'ninep', hostname: 'ninep-pod' }, { timeoutMs: scaledMs(60_000) });
    expect(pod.sharedDirMounted).toBe(true);
    const status = await vm.qmp.execute<{ status: { statuses: string[] } }>('x-query-virtio-status', { path: qomPath });
    // 7.2 names each bit with its meaning: "VIRTIO_CONFIG_S_DRIVER_OK: Driver setup and ready".
    expect(status.status.statuses.some((bit) => bit.startsWith('VIRTIO_CONFIG_S_DRIVER_OK'))).toBe(true);
    // A host file read through the guest's mount.
    const hello = await agent.statSharedPath({ relativePath: 'hello.txt', readContent: true }, { timeoutMs: scaledMs(20_000) });
    expect(Buffer.from(hello.content).toString()).toBe('from the host over 9p\n');
    // crun in the clone runs a container whose rootfs comes through 9p, in the pod's UTS
    // namespace; what it writes lands in the host's directory.
    const spec9p = guestProbeSpec({
      pausePid: pod.pausePid,
      args: ['/bin/busybox', 'sh', '-c', '/bin/busybox hostname > /hostname.txt'],
      cgroupsPath: '/kata-ts/probe9p',
    });
    const ctr = await agent.createContainer(
      {
        containerId: 'probe9p',
        ociConfigJson: JSON.stringify(spec9p),
        rootfsPath: `${pod.sharedDir}/containers/probe/rootfs`,
        stdio: 'STDIO_MODE_PIPES',
      },
      { timeoutMs: scaledMs(60_000) },
    );
    expect(ctr.pid).toBeGreaterThan(0);
    await agent.startContainer('probe9p', { timeoutMs: scaledMs(60_000) });
    expect(await agent.waitContainer('probe9p', { timeoutMs: scaledMs(60_000) })).toMatchObject({ exitCode: 0 });
    expect(await fsp.readFile(path.join(rootfs, 'hostname.txt'), 'utf8')).toBe('ninep-pod\n');
    await agent.deleteContainer('probe9p', true, { timeoutMs: scaledMs(30_000) });
  }, 300_000);

  it('a cold boot of the same shape, for comparison (agent ready, PSS)', async () => {
    const workDir = tracker.workDir();
    const paths = { ...vmPaths(workDir), agentSocket: path.join(workDir, 'agent.sock') };
    const { withAgent: _unused, ...argvSpec } = spec;
    const started = Date.now();
    const vm = tracker.track(
      await startVm({ qemuBinary: QEMU, argv: buildQemuArgv({ ...argvSpec, name: 'cold', paths }), workDir, logger }),
    );
    await vm.resume();
    const agent = await agentReady(paths.agentSocket, scaledMs(180_000));
    clients.push(agent);
    numbers.coldAgentReadyMs = Date.now() - started;
    await agent.createPod({ podId: 'coldpod', hostname: 'coldpod' }, { timeoutMs: scaledMs(60_000) });
    numbers.coldPssKiB = processPssKiB(vm.pid);
    expect(numbers.coldPssKiB).toBeGreaterThan(0);
  }, 600_000);
});
