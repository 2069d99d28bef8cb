/**
 * The systemd driver: the VMM goes into a transient scope `kata-ts-<sandbox id>.scope` in the
 * pod's slice, created over D-Bus. The only file of kata-ts that imports dbus-next.
 *
 * Each operation opens its own connection and closes it: nothing to recover when systemd or the
 * bus restarts, and systemd drops the connection's job subscription with it.
 */
import dbus from 'dbus-next';
import { internal, invalid, isReason, KataError, precondition, timedOut, unavailable } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { describeRecord } from './describe.js';
import { detectCgroupMode } from './detect.js';
import { checkPidsMax, planLimits, type SystemdProperty, systemdLimitProperties, systemdWeightProperty } from './limits.js';
import { parseSystemdParent, validateParentFor, vmmCgroupName } from './parent.js';
import { cgroupDirOf, readCgroupMounts, readProcCgroup } from './procfs.js';
import { dbusErrorName, systemdError, withTimeout } from './systemd-errors.js';
import type { CgroupDriver, CgroupDriverOptions, CgroupMode, PlacementRecord, PlaceRequest, VmmLimits } from './types.js';

const SYSTEMD = 'org.freedesktop.systemd1';
const MANAGER_PATH = '/org/freedesktop/systemd1';
const MANAGER = 'org.freedesktop.systemd1.Manager';
const DEFAULT_TIMEOUT_MS = 30_000;

/** One connection to the manager: method calls with a deadline, and JobRemoved results by job path. */
class ManagerConnection {
  private readonly jobResults = new Map<string, string>();
  private readonly jobWaiters = new Map<string, (result: string) => void>();
  private closed = false;

  private constructor(
    private readonly bus: dbus.MessageBus,
    readonly address: string,
    private readonly timeoutMs: number,
  ) {
    bus.on('message', (msg: dbus.Message) => {
      if (msg.type !== dbus.MessageType.SIGNAL || msg.interface !== MANAGER || msg.member !== 'JobRemoved') return;
      const [, job, , result] = msg.body as [number, string, string, string];
      const waiter = this.jobWaiters.get(job);
      if (waiter !== undefined) waiter(result);
      else this.jobResults.set(job, result);
    });
  }

  /** Connects (null = the system bus); UNAVAILABLE when the bus cannot be reached in time. */
  static async open(dbusAddress: string | null, timeoutMs: number, logger: Logger): Promise<ManagerConnection> {
    const address = dbusAddress ?? process.env.DBUS_SYSTEM_BUS_ADDRESS ?? 'unix:path=/var/run/dbus/system_bus_socket';
    const bus = dbusAddress === null ? dbus.systemBus() : dbus.sessionBus({ busAddress: dbusAddress });
    const connected = new Promise<void>((resolve, reject) => {
      bus.once('connect', () => resolve());
      bus.once('error', (err: unknown) => reject(err));
    });
    // Later errors (the bus going away) fail the pending call through its deadline; they must
    // not crash the daemon as unhandled 'error' events.
    bus.on('error', (err: unknown) => logger.debug({ err, address }, 'D-Bus connection error'));
    try {
      await withTimeout(connected, timeoutMs, () =>
        unavailable('SYSTEMD_UNAVAILABLE', `the D-Bus bus at ${address} did not accept a connection within ${timeoutMs} ms.`),
      );
    } catch (err) {
      bus.disconnect();
      if (err instanceof KataError) throw err;
      throw unavailable('SYSTEMD_UNAVAILABLE', `the D-Bus bus at ${address} could not be reached.`, { cause: err, details: { address } });
    }
    return new ManagerConnection(bus, address, timeoutMs);
  }

  async call(
    member: string,
    signature: string,
    body: unknown[],
    opts: { path?: string; iface?: string; dest?: string } = {},
  ): Promise<unknown[]> {
    const msg = new dbus.Message({
      destination: opts.dest ?? SYSTEMD,
      path: opts.path ?? MANAGER_PATH,
      interface: opts.iface ?? MANAGER,
      member,
      signature,
      body,
    });
    const reply = await withTimeout(this.bus.call(msg), this.timeoutMs, () =>
      timedOut('SYSTEMD_TIMEOUT', `systemd did not answer ${member} within ${this.timeoutMs} ms.`, { details: { address: this.address } }),
    );
    return reply?.body ?? [];
  }

  /** Asks for JobRemoved signals; must precede the call that creates the job. */
  async subscribeJobs(): Promise<void> {
    const rule = `type='signal',sender='${SYSTEMD}',path='${MANAGER_PATH}',interface='${MANAGER}',member='JobRemoved'`;
    await this.call('AddMatch', 's', [rule], {
      dest: 'org.freedesktop.DBus',
      path: '/org/freedesktop/DBus',
      iface: 'org.freedesktop.DBus',
    });
    try {
      await this.call('Subscribe', '', []);
    } catch (err) {
      if (dbusErrorName(err) !== 'org.freedesktop.systemd1.AlreadySubscribed') throw err;
    }
  }

  /** The result of a job ("done", "failed", "timeout", "canceled", "dependency", "skipped"). */
  waitJob(job: string, what: string): Promise<string> {
    const known = this.jobResults.get(job);
    if (known !== undefined) return Promise.resolve(known);
    const result = new Promise<string>((resolve) => this.jobWaiters.set(job, resolve));
    return withTimeout(result, this.timeoutMs, () =>
      timedOut('SYSTEMD_JOB_TIMEOUT', `systemd did not finish the job for ${what} within ${this.timeoutMs} ms.`, { details: { job } }),
    ).finally(() => this.jobWaiters.delete(job));
  }

  async unitProperty(unit: string, iface: string, property: string): Promise<unknown> {
    const [unitPath] = (await this.call('GetUnit', 's', [unit])) as [string];
    const [variant] = (await this.call('Get', 'ss', [iface, property], { path: unitPath, iface: 'org.freedesktop.DBus.Properties' })) as [
      dbus.Variant,
    ];
    return variant.value;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.bus.disconnect();
  }
}

/** Hierarchies holding the limits that the VMM is not in (by record key). */
export function missingLimitHierarchies(paths: Record<string, string>, mode: CgroupMode): string[] {
  if (mode === 'v2') return paths.unified === undefined ? ['unified'] : [];
  return ['cpu', 'memory'].filter((c) => !Object.keys(paths).some((k) => k.split(',').includes(c)));
}

function toDbusProperties(props: SystemdProperty[]): [string, dbus.Variant][] {
  return props.map(([name, signature, value]) => [name, new dbus.Variant(signature, value)]);
}

/** What `probeSystemdManager` reports: the manager is there and which systemd it is. */
export interface SystemdManagerInfo {
  address: string;
  version: string;
}

/** Reads the manager's Version; UNAVAILABLE when there is no manager on that bus (doctor, test harness). */
export async function probeSystemdManager(dbusAddress: string | null, logger: Logger, timeoutMs = 5_000): Promise<SystemdManagerInfo> {
  const conn = await ManagerConnection.open(dbusAddress, timeoutMs, logger);
  try {
    const [variant] = (await conn
      .call('Get', 'ss', [MANAGER, 'Version'], { iface: 'org.freedesktop.DBus.Properties' })
      .catch((err: unknown) => {
        throw systemdError(err, 'Get Version', conn.address);
      })) as [dbus.Variant];
    return { address: conn.address, version: String(variant.value) };
  } finally {
    conn.close();
  }
}

export class SystemdDriver implements CgroupDriver {
  readonly name = 'systemd' as const;
  private readonly logger: Logger;
  private readonly timeoutMs: number;
  private modeCache: CgroupMode | undefined;

  constructor(private readonly opts: CgroupDriverOptions) {
    this.logger = opts.logger.child({ component: 'cgroup-systemd' });
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.modeCache = opts.mode;
  }

  validateParent(cgroupParent: string): void {
    validateParentFor('systemd', cgroupParent);
  }

  private async mode(): Promise<CgroupMode> {
    this.modeCache ??= await detectCgroupMode(this.opts.cgroupRoot);
    return this.modeCache;
  }

  private open(): Promise<ManagerConnection> {
    return ManagerConnection.open(this.opts.dbusAddress, this.timeoutMs, this.logger);
  }

  /** Calls the manager, mapping its errors; `what` names the unit for messages. */
  private async managerCall(conn: ManagerConnection, member: string, signature: string, body: unknown[], what: string): Promise<unknown[]> {
    try {
      return await conn.call(member, signature, body);
    } catch (err) {
      throw systemdError(err, `${member} of ${what}`, conn.address);
    }
  }

  /** StopUnit and wait for its job, then ResetFailedUnit; a unit that is not there is fine. */
  private async stopAndReset(conn: ManagerConnection, unit: string): Promise<void> {
    try {
      const [job] = (await this.managerCall(conn, 'StopUnit', 'ss', [unit, 'replace'], unit)) as [string];
      const result = await conn.waitJob(job, `stopping ${unit}`);
      if (result !== 'done') this.logger.warn({ unit, result }, 'stop job did not finish with "done"');
    } catch (err) {
      if (!isReason(err, 'SYSTEMD_NO_SUCH_UNIT')) throw err;
    }
    try {
      await this.managerCall(conn, 'ResetFailedUnit', 's', [unit], unit);
    } catch (err) {
      if (!isReason(err, 'SYSTEMD_NO_SUCH_UNIT')) throw err;
    }
  }

  async place(req: PlaceRequest): Promise<PlacementRecord> {
    const plan = planLimits(req.limits);
    const parent = parseSystemdParent(req.cgroupParent);
    const unit = `${vmmCgroupName(req.sandboxId)}.scope`;
    const pids = [req.pid, ...(req.extraPids ?? [])];
    for (const pid of pids) {
      if (!Number.isSafeInteger(pid) || pid <= 0)
        throw invalid('CGROUP_PID_INVALID', `pid ${pid} is not a process id.`, { details: { pid } });
    }
    checkPidsMax(req.pidsMax);
    if (req.parentCpuShares !== undefined && (parent.slice === null || parent.path === '')) {
      throw invalid('CGROUP_PARENT_INVALID', 'a parent given a CPU weight of its own must name a slice, not the root or default slice.', {
        details: { cgroupParent: req.cgroupParent },
      });
    }
    const mode = await this.mode();
    const props: SystemdProperty[] = [
      ['PIDs', 'au', pids],
      ['Description', 's', `kata-ts VMM of sandbox ${req.sandboxId}`],
      // The VMM creates no cgroups of its own, but Delegate keeps systemd from rewriting the
      // scope's controllers behind kata-ts's back (and lets a resize write them directly).
      ['Delegate', 'b', true],
      // No implicit ordering against shutdown.target / sysinit: the scope's lifetime is the
      // sandbox's, ended by kata-ts, not by systemd's transactions.
      ['DefaultDependencies', 'b', false],
      ['CPUAccounting', 'b', true],
      ['MemoryAccounting', 'b', true],
      ['TasksAccounting', 'b', true],
      ...systemdLimitProperties(plan, mode),
      // systemd writes pids.max of the scope (v1 pids hierarchy or cgroup2) before the PIDs join.
      ...(req.pidsMax === undefined ? [] : [['TasksMax', 't', BigInt(req.pidsMax)] as const]),
    ];
    if (parent.slice !== null) props.push(['Slice', 's', parent.slice]);
    const body = [unit, 'fail', toDbusProperties(props), []];
    const conn = await this.open();
    let started = false;
    try {
      await conn.subscribeJobs().catch((err: unknown) => {
        throw systemdError(err, `Subscribe for ${unit}`, conn.address);
      });
      let job: string;
      try {
        [job] = (await this.managerCall(conn, 'StartTransientUnit', 'ssa(sv)a(sa(sv))', body, unit)) as [string];
      } catch (err) {
        if (!isReason(err, 'SYSTEMD_UNIT_EXISTS')) throw err;
        // Left by a crashed attempt for the same sandbox id: clear it and try once more.
        this.logger.warn({ unit }, 'scope already exists; stopping the stale one and retrying once');
        await this.stopAndReset(conn, unit);
        [job] = (await this.managerCall(conn, 'StartTransientUnit', 'ssa(sv)a(sa(sv))', body, unit)) as [string];
      }
      started = true;
      const result = await conn.waitJob(job, `starting ${unit}`);
      if (result !== 'done') {
        throw precondition('SYSTEMD_JOB_FAILED', `systemd's job starting ${unit} finished with result "${result}".`, {
          details: { unit, job, result },
        });
      }
      const controlGroup = String(await conn.unitProperty(unit, 'org.freedesktop.systemd1.Scope', 'ControlGroup'));
      const slice = String(await conn.unitProperty(unit, 'org.freedesktop.systemd1.Scope', 'Slice'));
      const paths = await this.pathsOf(req.pid, controlGroup);
      if (Object.keys(paths).length === 0) {
        throw internal('SYSTEMD_PID_NOT_PLACED', `systemd started ${unit} but pid ${req.pid} is not in its cgroup ${controlGroup}.`, {
          details: { unit, controlGroup, pid: req.pid },
        });
      }
      for (const pid of pids.slice(1)) {
        if (Object.keys(await this.pathsOf(pid, controlGroup)).length === 0) {
          throw internal('SYSTEMD_PID_NOT_PLACED', `systemd started ${unit} but pid ${pid} is not in its cgroup ${controlGroup}.`, {
            details: { unit, controlGroup, pid },
          });
        }
      }
      // The budget holds only if the VMM sits in the scope where the limits live: cgroup2, or
      // the v1 cpu and memory hierarchies. A manager that does not realise them there (it
      // cannot write them) would leave the VMM unlimited: refused rather than placed anyway.
      const missing = missingLimitHierarchies(paths, mode);
      if (missing.length > 0) {
        throw precondition(
          'SYSTEMD_LIMITS_NOT_APPLIED',
          `systemd placed pid ${req.pid} in ${unit} but not in its ${missing.join(' and ')} cgroup, so the limits would not apply.`,
          { details: { unit, controlGroup, paths } },
        );
      }
      if (req.parentCpuShares !== undefined) {
        // The slice exists now (the scope's start made it); runtime=true: nothing written to /etc.
        const weight = systemdWeightProperty(req.parentCpuShares, mode);
        await this.managerCall(conn, 'SetUnitProperties', 'sba(sv)', [slice, true, toDbusProperties([weight])], slice);
      }
      this.logger.info({ sandboxId: req.sandboxId, unit, slice, controlGroup, paths }, 'VMM placed in a systemd scope');
      return {
        driver: 'systemd',
        cgroupParent: req.cgroupParent,
        mode,
        unit,
        slice,
        paths,
        limits: { ...req.limits },
        ...(req.pidsMax === undefined ? {} : { pidsMax: req.pidsMax }),
      };
    } catch (err) {
      if (started) {
        // Never leave a half-made scope behind (it would also hold the VMM).
        await this.stopAndReset(conn, unit).catch((e: unknown) => this.logger.error({ err: e, unit }, 'could not clean up a failed scope'));
      }
      throw err;
    } finally {
      conn.close();
    }
  }

  /** Hierarchy key -> directory for every hierarchy in which the pid sits in the scope's cgroup. */
  private async pathsOf(pid: number, controlGroup: string): Promise<Record<string, string>> {
    const entries = await readProcCgroup(pid);
    const mounts = await readCgroupMounts();
    const paths: Record<string, string> = {};
    for (const entry of entries ?? []) {
      if (entry.path !== controlGroup) continue;
      const dir = cgroupDirOf(mounts, entry);
      if (dir === undefined) continue;
      const key =
        entry.controllers.length === 0
          ? 'unified'
          : entry.controllers.join(',') === 'name=systemd'
            ? 'systemd'
            : entry.controllers.join(',');
      paths[key] = dir;
    }
    return paths;
  }

  async update(record: PlacementRecord, limits: VmmLimits): Promise<PlacementRecord> {
    const plan = planLimits(limits);
    const unit = record.unit;
    if (unit === undefined) throw invalid('CGROUP_RECORD_INVALID', 'placement record of the systemd driver has no unit.');
    const conn = await this.open();
    try {
      // runtime=true: the change lives as long as the transient scope, nothing written to /etc.
      await this.managerCall(
        conn,
        'SetUnitProperties',
        'sba(sv)',
        [unit, true, toDbusProperties(systemdLimitProperties(plan, record.mode))],
        unit,
      );
    } finally {
      conn.close();
    }
    this.logger.info({ unit, limits }, 'VMM scope limits updated');
    return { ...record, limits: { ...limits } };
  }

  async placementFor(sandboxId: string, cgroupParent: string): Promise<PlacementRecord> {
    const parent = parseSystemdParent(cgroupParent);
    return {
      driver: 'systemd',
      cgroupParent,
      mode: await this.mode(),
      unit: `${vmmCgroupName(sandboxId)}.scope`,
      ...(parent.slice === null ? {} : { slice: parent.slice }),
      paths: {},
      limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 },
    };
  }

  async remove(record: PlacementRecord): Promise<void> {
    const unit = record.unit;
    if (unit === undefined) throw invalid('CGROUP_RECORD_INVALID', 'placement record of the systemd driver has no unit.');
    const conn = await this.open();
    try {
      await conn.subscribeJobs().catch((err: unknown) => {
        throw systemdError(err, `Subscribe for ${unit}`, conn.address);
      });
      await this.stopAndReset(conn, unit);
    } finally {
      conn.close();
    }
    this.logger.info({ unit }, 'VMM scope stopped');
  }

  describe(record: PlacementRecord): Record<string, string> {
    return describeRecord(record);
  }
}
