/**
 * The pool of pre-booted VMs (docs/pool.md): per handler, `pool.sizes[handler]` VMs booted to
 * "agent ready" ahead of demand, one boot at a time in the pool's cgroup (a low CPU weight) at
 * nice 19, each in a fresh network namespace that becomes its pod's. RunPodSandbox asks `claim`
 * (through CreateDeps.pool) after planning; a pod that fits takes a VM (claim.ts), one that does
 * not boots cold with the reason recorded.
 * Pooled VMs are recorded (`<stateDir>/pool/`), found again at start, or discarded.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { Gauge, type Registry } from 'prom-client';
import type { AgentClient } from '../../agent-client/index.js';
import { type CgroupDriver, type PlacementRecord, sharesToWeight, vmmPidsMax } from '../../cgroups/index.js';
import { errorMessage, invalid } from '../../common/errors.js';
import { newObjectId } from '../../common/ids.js';
import type { Logger } from '../../common/logger.js';
import { poolCgroupParent } from '../../config/defaults.js';
import { resolveHandler } from '../../config/handlers.js';
import type { KataConfig } from '../../config/types.js';
import { attachVm, isSameLiveProcess, startVm, type VmProcess } from '../../hypervisor/index.js';
import { createNetns, deleteNetns, NETNS_DIR, netnsNameFor, type PodNetworks } from '../../network/index.js';
import type { PcieHostFacts } from '../../pcie/index.js';
import type { HostCapacity } from '../../sizing/types.js';
import type { RuntimeFacts } from '../facts.js';
import { RollbackSteps } from '../rollback.js';
import { connectAgentClient, reopenAgentClient } from '../sandbox/agent.js';
import type { CreateDeps, CreatedSandbox, SandboxPool, SandboxPreparation } from '../sandbox/create-types.js';
import { leaseOwnerOf, VmmIdentities } from '../sandbox/identities.js';
import { buildJail, releaseJail } from '../sandbox/jail.js';
import { poolVmWorkDir, sandboxArgvPaths, sandboxJailDir, sandboxVmmDir, sandboxVmPaths } from '../sandbox/paths.js';
import { nowNs } from '../sandbox/record.js';
import { removeWorkDir } from '../sandbox/shared-dir.js';
import { restrictSocketModes } from '../sandbox/socket-modes.js';
import { RecordStore } from '../store.js';
import { claimPooledVm } from './claim.js';
import { type PoolKey, type PoolMiss, planPoolVm, poolCgroupLimits, poolMiss, samePoolKey, withPoolCgroup } from './plan.js';
import { POOLED_VM_RECORD_KIND, type PooledVmRecord } from './record.js';
import { cpuMsOf, POOL_NICE, type PooledVm, poolVmRoot, reniceProcess } from './vm.js';
import { warmUpGuest } from './warm.js';

export interface PoolDeps {
  config: KataConfig;
  facts: RuntimeFacts;
  cgroups: CgroupDriver;
  host: HostCapacity;
  readPcieFacts(): Promise<PcieHostFacts>;
  network?: PodNetworks;
  logger: Logger;
  /** The node's VMM identity leases; one over config.hypervisor.vmmIdentities unless given. */
  identities?: VmmIdentities;
}

/** The pool of one handler as status, doctor and metrics show it. */
export interface PoolHandlerStatus {
  handler: string;
  size: number;
  ready: number;
  booting: number;
  claimed: number;
  coldMisses: number;
  refillFailures: number;
  /** The last pooled VM's boot: wall and QEMU CPU time (ms). */
  lastBootMs: number | null;
  lastBootCpuMs: number | null;
  lastMiss: PoolMiss | null;
  /** QEMU pids of the ready VMs. */
  pids: number[];
  /** Where pooled VMs' QEMUs are placed until claimed: the pool's cgroup and its CPU weight. */
  cgroup: PoolCgroupStatus;
}

export interface PoolCgroupStatus {
  driver: string;
  /** pool.cgroupParent, or the driver's default; each VM's cgroup is `kata-ts-<pool VM id>` below it. */
  parent: string;
  /** cgroup v1 cpu.shares of the pool's cgroup and of each VM's (pool.cpuShares). */
  cpuShares: number;
  /** cgroup v2 cpu.weight for those shares (sharesToWeight). */
  cpuWeight: number;
  /** The nice value of every QEMU thread while pooled. */
  nice: number;
}

const REFILL_RETRY_MS = 10_000;
/**
 * A pooled boot runs at a low CPU weight and nice 19: on a busy node it yields to every pod, so it
 * may take several times a cold boot's ready budget (hypervisor.readyTimeoutMs); no request waits
 * on it.
 */
const POOL_BOOT_BUDGET_FACTOR = 4;

export class PoolManager implements SandboxPool {
  readonly store: RecordStore<PooledVmRecord>;
  private readonly ready = new Map<string, PooledVm[]>();
  private readonly booting = new Map<string, number>();
  private readonly counters = new Map<string, { claimed: number; coldMisses: number; refillFailures: number; lastMiss: PoolMiss | null }>();
  private readonly identities: VmmIdentities;
  private readonly log: Logger;
  private refill: Promise<void> | null = null;
  private closed = false;
  private retryTimer: NodeJS.Timeout | undefined;
  /** The QEMU of the boot in flight: killed by close() (a half-booted VM is never found again). */
  private inflight: VmProcess | undefined;

  /** The pool's cgroup (pool.cgroupParent or the driver's default). */
  readonly cgroupParent: string;

  constructor(private readonly deps: PoolDeps) {
    this.cgroupParent = poolCgroupParent(deps.config.pool, deps.cgroups.name);
    this.log = deps.logger.child({ component: 'pool' });
    this.store = new RecordStore<PooledVmRecord>(deps.config.stateDir, POOLED_VM_RECORD_KIND, deps.logger);
    this.identities = deps.identities ?? new VmmIdentities(deps.config.hypervisor.vmmIdentities, this.log);
  }

  /** Handlers with a pool, and their sizes. */
  sizes(): Array<[string, number]> {
    return Object.entries(this.deps.config.pool.sizes).filter(([, n]) => n > 0);
  }

  /**
   * At daemon start: each recorded VM found again (same pid and start time, its sockets, its agent)
   * when it still matches the config, discarded otherwise (a config change drains the pool).
   */
  async recover(): Promise<void> {
    if (this.sizes().length > 0) {
      try {
        this.deps.cgroups.validateParent(this.cgroupParent);
      } catch (err) {
        throw invalid(
          'CONFIG_INVALID',
          `/pool/cgroupParent "${this.cgroupParent}" does not suit the ${this.deps.cgroups.name} cgroup driver: ${errorMessage(err)}`,
          {
            details: { field: '/pool/cgroupParent', cgroupParent: this.cgroupParent, driver: this.deps.cgroups.name },
          },
        );
      }
    }
    await this.store.init();
    await fsp.mkdir(poolVmRoot(this.deps.config.stateDir), { recursive: true, mode: 0o700 });
    // The key of each handler's pooled VM is planned from the host's PCIe facts, read once.
    if (this.sizes().length > 0) this.planCache ??= await this.deps.readPcieFacts();
    const { records } = await this.store.load();
    const known = new Set<string>();
    for (const record of records) {
      known.add(path.basename(record.workDir));
      const why = await this.stale(record);
      if (why !== null) {
        this.log.info({ poolVmId: record.id, why }, 'pooled VM discarded');
        await this.discardRecord(record, undefined, undefined);
        continue;
      }
      const vmm = record.vmm;
      if (vmm === null) continue;
      try {
        const vm = await attachVm({
          pid: vmm.pid,
          startTimeTicks: vmm.startTimeTicks,
          qmpSocket: vmm.qmpSocket,
          readySocket: vmm.readySocket,
          qemuLog: vmm.qemuLog,
          consoleLog: vmm.consoleLog,
          logger: this.log,
          qmpTimeoutMs: this.deps.config.hypervisor.qmpTimeoutMs,
        });
        const agent = reopenAgentClient(
          vmm.agentSocket,
          this.log.child({ poolVmId: record.id }),
          undefined,
          this.deps.config.hypervisor.agentKeepalive,
        );
        this.readyList(record.handler).push({ record, vm, agent });
        this.log.info({ poolVmId: record.id, pid: vmm.pid }, 'pooled VM found again');
      } catch (err) {
        this.log.warn({ poolVmId: record.id, err: errorMessage(err) }, 'pooled VM could not be found again; discarded');
        await this.discardRecord(record, undefined, undefined);
      }
    }
    // Work dirs no record names: what a crash between mkdir and the first record write left.
    for (const entry of await fsp.readdir(poolVmRoot(this.deps.config.stateDir))) {
      if (!known.has(entry) || !records.some((r) => path.basename(r.workDir) === entry)) {
        if (records.some((r) => path.basename(r.workDir) === entry)) continue;
        await removeWorkDir(path.join(poolVmRoot(this.deps.config.stateDir), entry), this.log);
      }
    }
  }

  /** Why a recorded VM no longer serves (null: it does). */
  private async stale(record: PooledVmRecord): Promise<string | null> {
    if (record.phase !== 'ready' || record.vmm === null) return 'its boot was cut short';
    if (record.placement === null) return 'it was booted before the pool had a cgroup of its own';
    if ((this.deps.config.pool.sizes[record.handler] ?? 0) === 0) return 'its handler has no pool any more';
    if (!isSameLiveProcess(record.vmm.pid, record.vmm.startTimeTicks)) return 'its QEMU is gone';
    const key = await this.keyFor(record.handler).catch(() => null);
    if (key === null || !samePoolKey(key, record.key)) return 'the config changed what a pooled VM is booted with';
    return null;
  }

  /** Start filling the pools in the background (after the daemon is ready). */
  start(): void {
    this.kick();
  }

  private kick(): void {
    if (this.closed || this.refill !== null) return;
    this.refill = this.refillLoop().finally(() => {
      this.refill = null;
    });
  }

  private async refillLoop(): Promise<void> {
    for (;;) {
      if (this.closed) return;
      const next = this.sizes().find(([h, n]) => this.readyList(h).length + (this.booting.get(h) ?? 0) < n);
      if (next === undefined) return;
      const [handler] = next;
      this.booting.set(handler, (this.booting.get(handler) ?? 0) + 1);
      try {
        const pooled = await this.fillOne(handler);
        if (this.closed) await this.discard(pooled);
        else this.readyList(handler).push(pooled);
      } catch (err) {
        this.countersOf(handler).refillFailures++;
        this.log.error({ handler, err: errorMessage(err) }, 'pool refill failed; trying again later');
        if (!this.closed) this.retryTimer = setTimeout(() => this.kick(), REFILL_RETRY_MS);
        return;
      } finally {
        this.booting.set(handler, (this.booting.get(handler) ?? 1) - 1);
      }
    }
  }

  /** Wait for the refill in flight (tests, benches). */
  async idle(): Promise<void> {
    while (this.refill !== null) await this.refill;
  }

  private readyList(handler: string): PooledVm[] {
    let list = this.ready.get(handler);
    if (list === undefined) {
      list = [];
      this.ready.set(handler, list);
    }
    return list;
  }

  private countersOf(handler: string) {
    let c = this.counters.get(handler);
    if (c === undefined) {
      c = { claimed: 0, coldMisses: 0, refillFailures: 0, lastMiss: null };
      this.counters.set(handler, c);
    }
    return c;
  }

  private async keyFor(handlerName: string): Promise<PoolKey> {
    return this.planFor(handlerName, '/pool-key-probe').key;
  }

  private planCache: PcieHostFacts | undefined;
  private planFor(handlerName: string, workDir: string) {
    const { config } = this.deps;
    const handler = resolveHandler(config, handlerName);
    const confined = handler.profile.vmmConfinement.unprivileged;
    const paths = sandboxArgvPaths(workDir, config.hypervisor, confined);
    if (this.planCache === undefined) throw new Error('PCIe facts not read');
    return {
      handler,
      confined,
      ...planPoolVm({
        handler,
        host: this.deps.host,
        hypervisor: config.hypervisor,
        accel: this.deps.facts.acceleration,
        pcieFacts: this.planCache,
        simulateVfioWith: config.pcie.simulateVfioWith,
        vmName: `kata-ts-pool-${path.basename(workDir).slice(0, 16)}`.replace(/[^A-Za-z0-9._-]/g, '-'),
        paths,
      }),
      paths,
    };
  }

  /** Boot one pooled VM to "agent ready"; on failure everything made for it is undone. */
  private async fillOne(handlerName: string): Promise<PooledVm> {
    const { config } = this.deps;
    this.planCache ??= await this.deps.readPcieFacts();
    const id = newObjectId();
    const workDir = poolVmWorkDir(config.stateDir, id);
    const log = this.log.child({ poolVmId: id, handler: handlerName });
    const planned = this.planFor(handlerName, workDir);
    const undo = new RollbackSteps(log);
    const started = Date.now();
    const record: PooledVmRecord = {
      id,
      phase: 'booting',
      handler: handlerName,
      key: planned.key,
      shape: {
        vcpus: planned.shape.vcpus,
        maxVcpus: planned.shape.maxVcpus,
        memoryMiB: planned.shape.memoryMiB,
        maxMemoryMiB: planned.shape.maxMemoryMiB,
      },
      createdAtNs: nowNs(),
      workDir,
      network: null,
      confinement: null,
      vmm: null,
      placement: null,
      guest: null,
      bootMs: null,
      bootCpuMs: null,
    };
    const persist = () => this.store.put(record);
    try {
      await fsp.mkdir(workDir, { mode: 0o700 });
      undo.push('remove work dir', () => removeWorkDir(workDir, log));
      await persist();
      undo.push('delete record', () => this.store.delete(id));
      if (this.deps.network !== undefined) {
        const netnsName = netnsNameFor(id);
        record.network = { netnsName, netnsPath: `${NETNS_DIR}/${netnsName}` };
        await persist();
        undo.push('delete netns', () => deleteNetns(netnsName));
        await createNetns(netnsName);
      }
      const vmPaths = sandboxVmPaths(workDir, planned.confined);
      const { agentSocket, virtiofsSocket, virtiofsdLog: _l, ...ownPaths } = vmPaths;
      let jail: { jailDir: string; identity: { uid: number; gid: number } } | undefined;
      if (planned.confined) {
        const owner = leaseOwnerOf(this.store, id);
        const identity = await this.identities.acquire(owner);
        undo.push('release the VMM identity', () => this.identities.release(identity.uid, owner));
        const vmmDir = sandboxVmmDir(workDir);
        const jailDir = sandboxJailDir(workDir);
        record.confinement = { uid: identity.uid, gid: identity.gid, jailDir, vmmDir };
        await persist();
        await fsp.mkdir(vmmDir, { mode: 0o700 });
        await fsp.chown(vmmDir, identity.uid, identity.gid);
        undo.push('release the jail', () => releaseJail(jailDir, log));
        const files = [config.hypervisor.kernelPath, config.hypervisor.initrdPath];
        if (config.hypervisor.guestImagePath !== null) files.push(config.hypervisor.guestImagePath);
        if (path.isAbsolute(planned.qemu.binary)) files.push(planned.qemu.binary);
        await buildJail(
          {
            jailDir,
            vmmDir,
            files,
            devices: {
              kvm: planned.qemu.accel.accel === 'kvm',
              tun: record.network !== null,
              vhostNet: false,
              vfioGroups: [],
              vfioFunctions: [],
              devRoot: config.pcie.devRoot,
            },
          },
          identity,
        );
        jail = { jailDir, identity };
      }
      // Below the pods that run: QEMU in the pool's cgroup (low CPU weight against the pods'
      // cgroups), placed before it runs (the jailer waits for it), every thread at nice 19 (low
      // against any other thread of its cgroup), until claimed.
      const launched: { vm?: VmProcess } = {};
      const vm = await startVm({
        qemuBinary: planned.qemu.binary,
        argv: planned.qemu.argv,
        workDir,
        paths: ownPaths,
        logger: log,
        qmpTimeoutMs: config.hypervisor.qmpTimeoutMs,
        ...(record.network === null ? {} : { netnsPath: record.network.netnsPath }),
        ...(jail === undefined ? {} : { jail }),
        place: async (pid) => {
          undo.push('remove the pool cgroup', async () => {
            const { vm: running } = launched;
            if (running !== undefined) await undo.attempt('kill QEMU', () => running.kill());
            await this.removePoolCgroup(record);
          });
          const placement = await this.deps.cgroups.place({
            sandboxId: id,
            cgroupParent: this.cgroupParent,
            pid,
            limits: poolCgroupLimits(config.pool.cpuShares),
            pidsMax: vmmPidsMax(record.shape.maxVcpus, 0, config.hypervisor.vmmPidsMargin),
            parentCpuShares: config.pool.cpuShares,
          });
          record.placement = withPoolCgroup(placement);
          await persist();
        },
      });
      launched.vm = vm;
      undo.push('kill QEMU', () => vm.kill());
      this.inflight = vm;
      if (this.closed) throw new Error('the daemon is stopping');
      record.vmm = {
        pid: vm.pid,
        startTimeTicks: vm.startTimeTicks,
        qmpSocket: ownPaths.qmpSocket,
        readySocket: ownPaths.readySocket,
        consoleLog: ownPaths.consoleLog,
        qemuLog: ownPaths.qemuLog,
        agentSocket,
        qemuVirtiofsSocket: planned.paths.virtiofsSocket ?? virtiofsSocket,
      };
      await persist();
      await restrictSocketModes(workDir);
      if (jail !== undefined) await restrictSocketModes(sandboxVmmDir(workDir));
      reniceProcess(vm.pid, POOL_NICE);
      await vm.resume();
      const report = await vm.waitForReady(config.hypervisor.readyTimeoutMs * POOL_BOOT_BUDGET_FACTOR);
      record.guest = { vcpus: report.vcpus, memoryKiB: report.memoryKiB };
      // No request waits on a pooled boot, and at nice 19 on a busy node the agent's start (node
      // under TCG) takes what it takes: it gets a ready budget of its own after the kernel's line.
      const agent = await connectAgentClient(
        agentSocket,
        log,
        config.hypervisor.readyTimeoutMs * POOL_BOOT_BUDGET_FACTOR,
        undefined,
        config.hypervisor.agentKeepalive,
      );
      undo.push('close the agent client', async () => agent.close());
      // Before it waits: the claim's first container then finds the guest's container path
      // compiled, crun in its page cache and QEMU's translation of it made (src/runtime/pool/warm.ts).
      const warm = await warmUpGuest(agent, config.hypervisor.readyTimeoutMs * POOL_BOOT_BUDGET_FACTOR, log);
      record.phase = 'ready';
      record.bootMs = Date.now() - started;
      record.bootCpuMs = cpuMsOf(vm.pid);
      await persist();
      log.info(
        {
          pid: vm.pid,
          bootMs: record.bootMs,
          bootCpuMs: record.bootCpuMs,
          shape: record.shape,
          warmUpMs: warm.ms,
          warmUpFailed: warm.failed,
        },
        'pooled VM ready',
      );
      return { record, vm, agent };
    } catch (err) {
      log.warn({ err: errorMessage(err) }, 'pooled VM boot failed; rolling back');
      await undo.run();
      throw err;
    } finally {
      this.inflight = undefined;
    }
  }

  /**
   * RunPodSandbox's question (CreateDeps.pool): a pooled VM grown into `prep`'s plan, or null with
   * `prep.record.origin` saying why the pod boots cold. A claim that fails discards its VM.
   */
  async claim(deps: CreateDeps, prep: SandboxPreparation): Promise<CreatedSandbox | null> {
    const { plan } = prep.record;
    const handlerName = plan.handler;
    const size = this.deps.config.pool.sizes[handlerName] ?? 0;
    const list = this.readyList(handlerName);
    let miss: PoolMiss | null;
    try {
      this.planCache ??= await this.deps.readPcieFacts();
      const key = this.planFor(handlerName, '/pool-key-probe').key;
      const candidate = list[0];
      miss = poolMiss({
        plan,
        key,
        joinsNetns: prep.req.joinNetns !== undefined,
        pooled:
          candidate === undefined
            ? undefined
            : { key: candidate.record.key, shape: { ...candidate.record.shape, hugepages: [], kernelParams: [] } },
        poolSize: size,
        withAgent: prep.layout.withAgent,
      });
      if (miss === null && prep.network !== null && prep.network.record.kind !== 'cni') {
        miss = { reason: 'POOL_NETNS_NOT_OURS', message: "the pod joins its caller's network namespace, not one the pool made" };
      }
      if (miss === null && (prep.network === null) !== (candidate?.record.network === null)) {
        miss = { reason: 'POOL_GUEST_DIFFERS', message: 'the pooled VM and the pod differ in having a pod network' };
      }
    } catch (err) {
      miss = { reason: 'POOL_GUEST_DIFFERS', message: `the pool could not be planned: ${errorMessage(err)}` };
    }
    if (miss !== null) {
      if (size > 0 || miss.reason !== 'POOL_DISABLED') {
        const c = this.countersOf(handlerName);
        c.coldMisses++;
        c.lastMiss = miss;
      }
      prep.record.origin = { kind: 'cold', poolMiss: miss };
      prep.req.logger.info({ reason: miss.reason, why: miss.message }, 'pod boots cold');
      return null;
    }
    const pooled = list.shift();
    if (pooled === undefined) throw new Error('unreachable: a fitting pooled VM vanished');
    this.kick();
    try {
      const created = await claimPooledVm(
        { deps, prep, pooled, identities: this.identities, poolStore: this.store },
        this.log.child({ sandboxId: prep.req.id, poolVmId: pooled.record.id }),
      );
      this.countersOf(handlerName).claimed++;
      return created;
    } catch (err) {
      // claimPooledVm has rolled back everything (the VM, its netns, its files): boot cold.
      prep.req.signal.throwIfAborted();
      const failed: PoolMiss = {
        reason: 'POOL_CLAIM_FAILED',
        message: `claiming pooled VM ${pooled.record.id} failed: ${errorMessage(err)}`,
      };
      const c = this.countersOf(handlerName);
      c.coldMisses++;
      c.lastMiss = failed;
      prep.record.origin = { kind: 'cold', poolMiss: failed };
      prep.req.logger.warn({ err: errorMessage(err) }, 'claiming a pooled VM failed; the pod boots cold');
      return null;
    }
  }

  status(): PoolHandlerStatus[] {
    return this.sizes().map(([handler, size]) => {
      const c = this.countersOf(handler);
      const list = this.readyList(handler);
      const last = list.at(-1)?.record;
      return {
        handler,
        size,
        ready: list.length,
        booting: this.booting.get(handler) ?? 0,
        claimed: c.claimed,
        coldMisses: c.coldMisses,
        refillFailures: c.refillFailures,
        lastBootMs: last?.bootMs ?? null,
        lastBootCpuMs: last?.bootCpuMs ?? null,
        lastMiss: c.lastMiss,
        pids: list.map((p) => p.vm.pid),
        cgroup: this.cgroupStatus(),
      };
    });
  }

  cgroupStatus(): PoolCgroupStatus {
    const { cpuShares } = this.deps.config.pool;
    return { driver: this.deps.cgroups.name, parent: this.cgroupParent, cpuShares, cpuWeight: sharesToWeight(cpuShares), nice: POOL_NICE };
  }

  /**
   * A pooled VM's cgroup (its QEMU gone), and the pool's when no other VM is in it: by its record,
   * or, when a crash came between placing QEMU and recording it, where it would be.
   */
  private async removePoolCgroup(record: PooledVmRecord): Promise<void> {
    let placement: PlacementRecord | null = record.placement;
    if (placement === null) {
      if (record.vmm === null) return;
      placement = withPoolCgroup(await this.deps.cgroups.placementFor(record.id, this.cgroupParent));
    }
    await this.deps.cgroups.remove(placement);
  }

  /** Stop refilling (a boot in flight is ended and rolled back); keep the ready VMs running (a restart finds them again). */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retryTimer);
    await this.inflight?.kill().catch(() => undefined);
    await this.idle();
    for (const list of this.ready.values()) for (const p of list) await p.agent.close();
  }

  /** Stop every pooled VM and remove what it holds (config change, tests, `drain`). */
  async drain(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retryTimer);
    await this.inflight?.kill().catch(() => undefined);
    await this.idle();
    for (const list of this.ready.values()) {
      for (const p of list.splice(0)) await this.discard(p);
    }
  }

  private async discard(p: PooledVm): Promise<void> {
    await this.discardRecord(p.record, p.vm, p.agent);
  }

  /** Everything of a pooled VM undone: QEMU, agent, jail, netns, identity, work dir, record. */
  private async discardRecord(record: PooledVmRecord, vm: VmProcess | undefined, agent: AgentClient | undefined): Promise<void> {
    const undo = new RollbackSteps(this.log);
    const log = this.log.child({ poolVmId: record.id });
    undo.push('delete record', () => this.store.delete(record.id));
    undo.push('remove work dir', () => removeWorkDir(record.workDir, log));
    if (record.confinement !== null) {
      const { uid } = record.confinement;
      undo.push('release the VMM identity', () => this.identities.release(uid, leaseOwnerOf(this.store, record.id)));
    }
    if (record.network !== null) {
      const { netnsName } = record.network;
      undo.push('delete netns', () => deleteNetns(netnsName));
    }
    if (record.confinement !== null) {
      const { jailDir } = record.confinement;
      undo.push('release the jail', () => releaseJail(jailDir, log));
    }
    // Runs after QEMU is gone (undo runs newest first).
    undo.push('remove the pool cgroup', () => this.removePoolCgroup(record));
    if (vm !== undefined) undo.push('kill QEMU', () => vm.kill());
    else if (record.vmm !== null && isSameLiveProcess(record.vmm.pid, record.vmm.startTimeTicks)) {
      const { pid } = record.vmm;
      undo.push('kill QEMU', async () => {
        process.kill(pid, 'SIGKILL');
        while (isSameLiveProcess(pid, record.vmm?.startTimeTicks ?? 0)) await new Promise((r) => setTimeout(r, 20));
      });
    }
    if (agent !== undefined) undo.push('close the agent client', async () => agent.close());
    await undo.run();
  }
}

/** `kata_ts_pool_vms{handler,state}` (ready, booting, claimed, cold_misses) read from `pool` at each scrape. */
export function registerPoolMetrics(registry: Registry, pool: Pick<PoolManager, 'status'>): void {
  new Gauge({
    name: 'kata_ts_pool_vms',
    help: 'Pooled VMs by handler: ready, booting, claimed and cold misses since start, the size configured.',
    labelNames: ['handler', 'state'],
    registers: [registry],
    collect() {
      for (const s of pool.status()) {
        this.set({ handler: s.handler, state: 'size' }, s.size);
        this.set({ handler: s.handler, state: 'ready' }, s.ready);
        this.set({ handler: s.handler, state: 'booting' }, s.booting);
        this.set({ handler: s.handler, state: 'claimed' }, s.claimed);
        this.set({ handler: s.handler, state: 'cold_misses' }, s.coldMisses);
      }
    },
  });
}
