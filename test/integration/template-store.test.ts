/**
 * The runtime's template store on real QEMU 7.2 (TCG) with the real guest and agent
 * (src/runtime/template/store.ts): a template is built once and verified on each later use; two
 * clones from it are ready only once reseeded (their kernels' bytes differ); a clone started in a
 * network namespace takes a NIC there and grows with the pool claim's steps; a clone that cannot
 * start is a miss that names its reason and leaves no QEMU (what the runtime falls back on); an
 * altered template is never used but rebuilt, and one of the same shape built from other inputs
 * is removed. Timings are printed (TEMPLATE_STORE_NUMBERS), never asserted.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/logger.js';
import { packageVersion } from '../../src/common/paths.js';
import { isSameLiveProcess, readProcStat } from '../../src/common/procfs.js';
import { plugNic } from '../../src/hypervisor/claim-hotplug.js';
import { type TemplateVmSpec, templatePaths } from '../../src/hypervisor/template.js';
import { growToShape } from '../../src/runtime/pool/claim.js';
import type { ReadyClone } from '../../src/runtime/template/clone.js';
import { type CloneOutcome, TemplateStore, templateDirName } from '../../src/runtime/template/store.js';
import { ensureAgentGuest } from '../helpers/agent-guest.js';
import { makeWorkDir, processesMentioning, QemuTracker } from '../helpers/hypervisor-guest.js';
import { until } from '../helpers/poll.js';
import { scaledMs } from '../helpers/time-scale.js';

const logger = silentLogger();
const QEMU = 'qemu-system-x86_64';

function expectClone(outcome: CloneOutcome): ReadyClone {
  if (outcome.kind !== 'clone') throw new Error(`expected a clone, got a miss: ${outcome.reason}: ${outcome.message}`);
  return outcome.clone;
}

describe('the template store: build once, verify, clone, miss, rebuild (QEMU 7.2, TCG)', () => {
  const tracker = new QemuTracker();
  const root = path.join('/dev/shm', `kata-ts-template-store-test-${randomBytes(4).toString('hex')}`);
  const workRoot = makeWorkDir('kts-tplstore-');
  const numbers: Record<string, number> = {};
  const clones: ReadyClone[] = [];
  let spec: TemplateVmSpec;
  let store: TemplateStore;

  beforeAll(() => {
    const guest = ensureAgentGuest();
    spec = {
      shape: { vcpus: 1, maxVcpus: 2, memoryMiB: 512, maxMemoryMiB: 1024, hugepages: [], kernelParams: [] },
      accel: 'tcg',
      ...guest,
      kernelParams: [],
      pcieArgs: ['-device', 'pcie-root-port,id=rp0,bus=pcie.0,addr=08.0,chassis=1,slot=1,port=1,io-reserve=0'],
      confidential: false,
      withAgent: true,
    };
    store = new TemplateStore({
      root,
      workRoot,
      qemuBinary: QEMU,
      hostVersion: packageVersion(),
      bootTimeoutMs: scaledMs(180_000),
      logger,
    });
  }, 600_000);

  afterAll(async () => {
    for (const c of clones) c.agent.close();
    await tracker.cleanup();
    // A template VM of an interrupted build: ours by its work dir on the command line.
    for (const pid of processesMentioning(workRoot)) {
      const stat = readProcStat(pid);
      if (stat !== undefined && isSameLiveProcess(pid, stat.startTimeTicks)) process.kill(pid, 'SIGKILL');
    }
    await fsp.rm(root, { recursive: true, force: true });
    await fsp.rm(workRoot, { recursive: true, force: true });
    console.log(`TEMPLATE_STORE_NUMBERS ${JSON.stringify(numbers)}`);
  });

  it('builds the template once; two clones from it, the second without a build, both reseeded', async () => {
    for (const name of ['store-a', 'store-b']) {
      const started = Date.now();
      const outcome = await store.tryClone(spec, { workDir: tracker.workDir(), name, agentTimeoutMs: scaledMs(60_000) });
      const clone = expectClone(outcome);
      tracker.track(clone.vm);
      clones.push(clone);
      numbers[`${name}Ms`] = Date.now() - started;
      numbers[`${name}ReadyMs`] = clone.readyMs;
      if (outcome.kind === 'clone') numbers[`${name}Built`] = outcome.template.built ? 1 : 0;
    }
    const [a, b] = clones;
    // One build: the second clone verified the template the first one built.
    expect(numbers['store-aBuilt']).toBe(1);
    expect(numbers['store-bBuilt']).toBe(0);
    expect(await fsp.readdir(root)).toEqual([templateDirName((await store.ensure(spec)).key).name]);
    expect(Buffer.from(a!.reseed.answer.urandomSample).equals(Buffer.from(b!.reseed.answer.urandomSample))).toBe(false);
    // Both run the pod's pause process.
    for (const [i, c] of clones.entries()) {
      const pod = await c.agent.createPod({ podId: `storepod${i}`, hostname: `storepod${i}` }, { timeoutMs: scaledMs(60_000) });
      expect(pod.pausePid).toBeGreaterThan(1);
    }
  }, 900_000);

  it("a clone started in a pod network namespace takes a NIC on its TAP there and grows to shape with the pool claim's steps", async () => {
    const netns = `kts-tplnet-${randomBytes(4).toString('hex')}`;
    const netnsPath = path.join('/run/netns', netns);
    execFileSync('ip', ['netns', 'add', netns]);
    let clone: ReadyClone | undefined;
    try {
      execFileSync('ip', ['-n', netns, 'tuntap', 'add', 'dev', 'tap0', 'mode', 'tap']);
      execFileSync('ip', ['-n', netns, 'link', 'set', 'tap0', 'up']);
      const outcome = await store.tryClone(spec, {
        workDir: tracker.workDir(),
        name: 'store-net',
        agentTimeoutMs: scaledMs(60_000),
        netnsPath,
      });
      clone = expectClone(outcome);
      tracker.track(clone.vm);
      const { vm, agent } = clone;
      // QEMU itself runs in the pod's namespace (nsenter execs it in place: the pid is QEMU's).
      expect((await fsp.stat(`/proc/${vm.pid}/ns/net`)).ino).toBe((await fsp.stat(netnsPath)).ino);
      // The NIC on the template's spare port, on the TAP the test made in that namespace (checked
      // above first: run elsewhere, QEMU as root would make a tap0 of its own there).
      await plugNic(vm.qmp, { tapName: 'tap0', mac: '02:6b:74:73:00:01', vhost: false, bus: 'rp0' });
      const qomPath = await until('the NIC listed as a virtio device', async () => {
        const devices = await vm.qmp.execute<Array<{ path: string; name: string }>>('x-query-virtio');
        return devices.find((d) => d.name === 'virtio-net')?.path;
      });
      await until(
        "the guest's virtio-net driver started the NIC",
        async () => {
          const status = await vm.qmp.execute<{ status: { statuses: string[] } }>('x-query-virtio-status', { path: qomPath });
          return status.status.statuses.some((bit) => bit.startsWith('VIRTIO_CONFIG_S_DRIVER_OK')) ? true : undefined;
        },
        scaledMs(60_000),
      );
      // The agent finds the NIC by its MAC and configures it (what a claim's ConfigureNetwork does).
      const configured = await agent.configureNetwork(
        { interfaces: [{ mac: '02:6b:74:73:00:01', mtu: 1500, addresses: ['10.213.0.2/24'] }] },
        { timeoutMs: scaledMs(30_000) },
      );
      expect(configured.interfaceNames).toHaveLength(1);
      // The pool claim's grow-to-shape steps on the clone: one vCPU and 128 MiB of virtio-mem.
      const budgetMs = scaledMs(120_000);
      const started = Date.now();
      const guest = await growToShape(
        vm,
        { addVcpus: 1, virtioMemMiB: 128, virtioMemMaxMiB: 512 },
        { vcpus: 2 },
        {
          remainingMs: () => Math.max(1, budgetMs - (Date.now() - started)),
          signal: AbortSignal.timeout(budgetMs),
          checkBudget: () => {
            if (Date.now() - started >= budgetMs) throw new Error('grow budget spent');
          },
        },
      );
      numbers.cloneGrowMs = Date.now() - started;
      expect(guest.vcpus).toBe(2);
      const facts = await agent.guestFacts({ timeoutMs: scaledMs(30_000) });
      expect(facts.onlineVcpus).toBe(2);
      expect(Number(facts.onlineMemoryKib)).toBe((512 + 128) * 1024);
    } finally {
      clone?.agent.close();
      await clone?.vm.kill().catch(() => undefined);
      execFileSync('ip', ['netns', 'del', netns]);
    }
  }, 600_000);

  it('a clone whose agent does not answer in time is a miss naming its reason, and leaves no QEMU', async () => {
    const workDir = tracker.workDir();
    // The clone's agent is given 1 ms to answer: the restore succeeds, the dial cannot.
    const outcome = await store.tryClone(spec, { workDir, name: 'store-miss', agentTimeoutMs: 1 });
    if (outcome.kind === 'clone') {
      tracker.track(outcome.clone.vm);
      clones.push(outcome.clone);
    }
    expect(outcome.kind).toBe('miss');
    if (outcome.kind !== 'miss') return;
    expect(outcome.reason).toMatch(/^[A-Z][A-Z0-9_]+$/);
    expect(outcome.message).not.toBe('');
    console.log(`TEMPLATE_STORE_MISS ${JSON.stringify(outcome)}`);
    expect(processesMentioning(workDir)).toEqual([]);
  }, 300_000);

  it('an altered template is rebuilt, and one of the same shape from older inputs removed', async () => {
    const current = await store.ensure(spec);
    expect(current.built).toBe(false);
    const files = templatePaths(current.templateDir);
    // One byte of the device state changed (root can write the 0444 file).
    const state = await fsp.readFile(files.stateFile);
    state[state.length >> 1]! ^= 0xff;
    await fsp.chmod(files.stateFile, 0o644);
    await fsp.writeFile(files.stateFile, state);
    // A template of the same shape built from other inputs (a kernel since replaced).
    const { shape, name } = templateDirName(current.key);
    const stale = path.join(root, `${shape}-${'0'.repeat(16)}`);
    await fsp.mkdir(stale);
    const started = Date.now();
    const rebuilt = await store.ensure(spec);
    numbers.rebuildMs = Date.now() - started;
    expect(rebuilt.built).toBe(true);
    expect(rebuilt.templateDir).toBe(current.templateDir);
    expect(rebuilt.record.builtAt).not.toBe(current.record.builtAt);
    expect(await fsp.readdir(root)).toEqual([name]);
    // The clones made from the old files run on (their private mappings keep the old pages).
    for (const c of clones) expect((await c.agent.guestFacts({ timeoutMs: scaledMs(30_000) })).onlineVcpus).toBe(1);
  }, 900_000);
});
