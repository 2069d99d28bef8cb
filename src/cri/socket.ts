import { promises as fsp, type Stats } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { errnoCode, precondition } from '../common/errors.js';
import type { Logger } from '../common/logger.js';

/** True when something accepts connections on the unix socket at `socketPath`. */
function somethingListens(socketPath: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = net.connect(socketPath);
    const done = (answer: boolean): void => {
      clearTimeout(timer);
      sock.destroy();
      resolve(answer);
    };
    const timer = setTimeout(() => done(true), timeoutMs); // a hung listener is still a listener
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

/**
 * Make `socketPath` bindable: create its directory (0750), and remove a stale socket file left by a
 * crashed daemon, but only when nothing listens on it; a live socket means another daemon runs
 * there and is refused rather than stolen.
 */
export async function prepareSocketPath(socketPath: string, logger: Logger): Promise<void> {
  await fsp.mkdir(path.dirname(socketPath), { recursive: true, mode: 0o750 });
  let stat: Stats;
  try {
    stat = await fsp.lstat(socketPath);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return;
    throw err;
  }
  if (!stat.isSocket()) {
    throw precondition('SOCKET_PATH_OCCUPIED', `socket path ${socketPath} exists and is not a socket`);
  }
  if (await somethingListens(socketPath)) {
    throw precondition('SOCKET_IN_USE', `another process is already serving on ${socketPath}`);
  }
  logger.warn({ socketPath }, 'removing stale socket left by an earlier run');
  await fsp.rm(socketPath, { force: true });
}
