import { isReason, unavailable } from '../../common/errors.js';
import { connectUnixNoFollow } from '../../common/nofollow.js';
import { type ExecuteOptions, type QmpClientOptions, QmpConnection } from './connection.js';
import type {
  QmpCpuInfoFast,
  QmpDeviceAddArgs,
  QmpEvent,
  QmpHotpluggableCpu,
  QmpMemorySizeSummary,
  QmpObjectAddArgs,
  QmpPciBus,
  QmpStatusInfo,
} from './types.js';

export { ANY_EVENT, type ExecuteOptions, type QmpClientOptions, type QmpCloseInfo, type QmpEventListener } from './connection.js';
export { QmpError } from './error.js';
export type * from './types.js';

/**
 * A QMP client: the protocol (QmpConnection: negotiation, ids, timeouts, events, close) plus
 * typed helpers for the commands the runtime uses. Open one with `QmpClient.open(stream)` over
 * any Duplex, or `connectQmp(socketPath)`.
 */
export class QmpClient extends QmpConnection {
  queryStatus(options?: ExecuteOptions): Promise<QmpStatusInfo> {
    return this.execute<QmpStatusInfo>('query-status', undefined, options);
  }

  /** Resume vCPUs (leaves `prelaunch` after -S, or `paused` after `stop`). */
  async cont(options?: ExecuteOptions): Promise<void> {
    await this.execute('cont', undefined, options);
  }

  /**
   * Stop the vCPUs (status `paused`, event STOP): the guest runs no instruction and its memory
   * stays as it is, while QEMU's main loop (QMP, chardevs) keeps serving. `cont` undoes it. QEMU
   * answers success also when the vCPUs were already stopped.
   */
  async stop(options?: ExecuteOptions): Promise<void> {
    await this.execute('stop', undefined, options);
  }

  /** Ask QEMU to exit now. QEMU may close the socket right after replying, so a close counts as done. */
  async quit(options?: ExecuteOptions): Promise<void> {
    try {
      await this.execute('quit', undefined, options);
    } catch (err) {
      if (isReason(err, 'QMP_CLOSED')) return;
      throw err;
    }
  }

  /** Press the ACPI power button; the guest decides whether and when to power off. */
  async systemPowerdown(options?: ExecuteOptions): Promise<void> {
    await this.execute('system_powerdown', undefined, options);
  }

  queryPci(options?: ExecuteOptions): Promise<QmpPciBus[]> {
    return this.execute<QmpPciBus[]>('query-pci', undefined, options);
  }

  queryCpusFast(options?: ExecuteOptions): Promise<QmpCpuInfoFast[]> {
    return this.execute<QmpCpuInfoFast[]>('query-cpus-fast', undefined, options);
  }

  queryMemorySizeSummary(options?: ExecuteOptions): Promise<QmpMemorySizeSummary> {
    return this.execute<QmpMemorySizeSummary>('query-memory-size-summary', undefined, options);
  }

  queryHotpluggableCpus(options?: ExecuteOptions): Promise<QmpHotpluggableCpu[]> {
    return this.execute<QmpHotpluggableCpu[]>('query-hotpluggable-cpus', undefined, options);
  }

  async deviceAdd(args: QmpDeviceAddArgs, options?: ExecuteOptions): Promise<void> {
    await this.execute('device_add', { ...args }, options);
  }

  /**
   * Request removal of device `id`. For PCIe devices this only starts the guest handshake: the
   * device is gone when DEVICE_DELETED arrives (see `deviceDelAndWait`).
   */
  async deviceDel(id: string, options?: ExecuteOptions): Promise<void> {
    await this.execute('device_del', { id }, options);
  }

  /** `device_del` and wait for the DEVICE_DELETED event naming `id`. */
  async deviceDelAndWait(id: string, timeoutMs = this.defaultTimeoutMs): Promise<QmpEvent> {
    const deleted = this.waitForEvent('DEVICE_DELETED', (e) => e.data?.device === id, timeoutMs);
    // The wait rejects on its own if device_del fails; keep that rejection from going unhandled.
    deleted.catch(() => undefined);
    await this.deviceDel(id, { timeoutMs });
    return deleted;
  }

  async objectAdd(args: QmpObjectAddArgs, options?: ExecuteOptions): Promise<void> {
    await this.execute('object-add', { ...args }, options);
  }

  async objectDel(id: string, options?: ExecuteOptions): Promise<void> {
    await this.execute('object-del', { id }, options);
  }

  async qomSet(path: string, property: string, value: unknown, options?: ExecuteOptions): Promise<void> {
    await this.execute('qom-set', { path, property, value }, options);
  }

  qomGet<T = unknown>(path: string, property: string, options?: ExecuteOptions): Promise<T> {
    return this.execute<T>('qom-get', { path, property }, options);
  }
}

/**
 * Connect to QEMU's QMP unix socket and negotiate capabilities. The socket is in a directory a
 * confined QEMU owns: it is reached without following a link (UNIX_SOCKET_UNSAFE otherwise, not
 * retried), so QEMU cannot point the daemon at another socket of the host.
 */
export async function connectQmp(socketPath: string, options: QmpClientOptions = {}): Promise<QmpClient> {
  const socket = await connectUnixNoFollow(socketPath).catch((err: unknown) => {
    if (isReason(err, 'UNIX_SOCKET_UNSAFE')) throw err;
    throw unavailable('QMP_CONNECT_FAILED', `QMP socket ${socketPath} could not be connected.`, { cause: err });
  });
  return QmpClient.open(socket, options);
}
