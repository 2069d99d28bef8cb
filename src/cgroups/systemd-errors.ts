/**
 * Errors of the systemd driver: D-Bus error names mapped to KataError kinds, and deadlines for
 * calls that D-Bus itself would let hang. No D-Bus types here (dbus-next stays in systemd.ts).
 */
import { alreadyExists, internal, KataError, notFound, precondition, unavailable } from '../common/errors.js';

/** D-Bus error names that mean "nobody to talk to". */
const UNREACHABLE = new Set([
  'org.freedesktop.DBus.Error.ServiceUnknown',
  'org.freedesktop.DBus.Error.NameHasNoOwner',
  'org.freedesktop.DBus.Error.NoReply',
  'org.freedesktop.DBus.Error.Disconnected',
  'org.freedesktop.DBus.Error.NoServer',
]);

/** The D-Bus error name of a failed call (dbus-next's DBusError carries it as `type`). */
export function dbusErrorName(err: unknown): string | undefined {
  if (err instanceof Error && err.name === 'DBusError' && typeof (err as { type?: unknown }).type === 'string') {
    return (err as unknown as { type: string }).type;
  }
  return undefined;
}

/** A failed manager call as a KataError; `what` names the call and its object. */
export function systemdError(err: unknown, what: string, address: string): KataError {
  if (err instanceof KataError) return err;
  const name = dbusErrorName(err);
  const details = { dbusError: name, address };
  // Spawn.*: the bus tried to activate a systemd1 service file instead - no manager on that bus.
  if (name !== undefined && (UNREACHABLE.has(name) || name.startsWith('org.freedesktop.DBus.Error.Spawn.'))) {
    return unavailable('SYSTEMD_UNAVAILABLE', `the systemd manager on ${address} did not answer ${what}.`, { cause: err, details });
  }
  switch (name) {
    case 'org.freedesktop.systemd1.NoSuchUnit':
      return notFound('SYSTEMD_NO_SUCH_UNIT', `systemd has no unit for ${what}.`, { cause: err, details });
    case 'org.freedesktop.systemd1.UnitExists':
      return alreadyExists('SYSTEMD_UNIT_EXISTS', `systemd already has the unit of ${what}.`, { cause: err, details });
    case 'org.freedesktop.DBus.Error.UnixProcessIdUnknown':
      // Also what a caller in another pid namespace than systemd's gets: PIDs resolve in systemd's.
      return precondition('CGROUP_PID_GONE', `the process to place with ${what} does not exist in systemd's pid namespace.`, {
        cause: err,
        details,
      });
    case 'org.freedesktop.DBus.Error.AccessDenied':
    case 'org.freedesktop.DBus.Error.InteractiveAuthorizationRequired':
      return precondition('SYSTEMD_ACCESS_DENIED', `systemd denied ${what}.`, { cause: err, details });
    case 'org.freedesktop.DBus.Error.InvalidArgs':
    case 'org.freedesktop.DBus.Error.PropertyReadOnly':
    case 'org.freedesktop.DBus.Error.UnknownProperty':
      return precondition('SYSTEMD_REFUSED', `systemd refused the arguments of ${what}.`, { cause: err, details });
    default:
      return internal('SYSTEMD_CALL_FAILED', `systemd failed ${what}.`, { cause: err, details });
  }
}

export function withTimeout<T>(promise: Promise<T>, timeoutMs: number, onTimeout: () => KataError): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(onTimeout()), timeoutMs);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}
