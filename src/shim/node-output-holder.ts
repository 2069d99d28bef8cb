/**
 * Node mode's output holder: a `kata-ts-shim-relay --hold <container id>` process per running
 * container whose output goes to containerd's FIFOs, holding their write ends open.
 *
 * Why: containerd reads a container's stdout and stderr FIFOs until every writer has closed them
 * and then stops for good (its copy ends at EOF). The writer is the core's output pump in the
 * shim process; in `pod` mode that process's death ends the pod anyway, but in `node` mode the
 * node server can die and be revived while the pod lives on, and without another writer holding
 * the FIFOs containerd's CRI would stop copying at the crash: the container's later output goes
 * nowhere, and the revived pump waits in vain for a reader to take its last bytes (which held up
 * the exit and then Delete past containerd's deadline for handling a TaskExit).
 *
 * The holder is started at the container's Start, its pid kept in the task's file, and released
 * (SIGTERM) once the container's output reached its end, before its exit is told: containerd's
 * Delete waits for the copy to see EOF. It ends by itself when containerd closes the FIFOs.
 */
import { spawn } from 'node:child_process';
import { closeSync, constants, openSync } from 'node:fs';
import path from 'node:path';
import { errnoCode, errorMessage } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import { readCmdline } from '../common/procfs.js';
import { RELAY_BINARY_NAME } from './node-relay.js';

/** The relay's flag that makes it a holder. */
export const HOLD_FLAG = '--hold';

/** Starts and releases holders (the Task service's view; absent in `pod` mode). */
export interface OutputHolder {
  /** A holder of the FIFOs (paths as this process opens them), its pid; undefined when none was needed or possible. */
  hold(containerId: string, fifos: { stdout: string; stderr: string }): Promise<number | undefined>;
  /** End the holder `pid` started for `containerId` (nothing when it is gone, or the pid is another process now). */
  release(containerId: string, pid: number): Promise<void>;
}

/** A FIFO's write end, or undefined when it has no reader (ENXIO) or there is none to open. */
function openWriteEnd(fifo: string): number | undefined {
  if (fifo === '') return undefined;
  try {
    return openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch (err) {
    if (errnoCode(err) === 'ENXIO') return undefined;
    throw err;
  }
}

/** Whether `pid` is the holder started for `containerId` (its command line says so). */
export function isHolderOf(pid: number, containerId: string, procRoot = '/proc'): boolean {
  const argv = readCmdline(pid, procRoot);
  return path.basename(argv[0] ?? '') === RELAY_BINARY_NAME && argv[1] === HOLD_FLAG && argv[2] === containerId;
}

/** How long release waits for the holder to be gone (it exits on SIGTERM at once). */
const RELEASE_WAIT_MS = 2_000;

/** Holders run from `binary` (the relay). */
export function outputHolder(binary: string, logger: Logger): OutputHolder {
  return {
    async hold(containerId, fifos) {
      const fds: number[] = [];
      try {
        const stdout = openWriteEnd(fifos.stdout);
        if (stdout !== undefined) fds.push(stdout);
        const stderr = fifos.stderr === fifos.stdout ? undefined : openWriteEnd(fifos.stderr);
        if (stderr !== undefined) fds.push(stderr);
        if (stdout === undefined && stderr === undefined) return undefined;
        const child = spawn(binary, [HOLD_FLAG, containerId], {
          stdio: ['ignore', stdout ?? 'ignore', stderr ?? 'ignore'],
          detached: true,
        });
        const pid = await new Promise<number | undefined>((resolve) => {
          child.once('spawn', () => resolve(child.pid));
          child.once('error', (err) => {
            logger.warn({ containerId, err: errorMessage(err) }, "the container output's holder could not be started");
            resolve(undefined);
          });
        });
        child.unref();
        return pid;
      } catch (err) {
        logger.warn({ containerId, err: errorMessage(err) }, "the container's output FIFOs could not be held");
        return undefined;
      } finally {
        for (const fd of fds) closeSync(fd);
      }
    },
    async release(containerId, pid) {
      if (pid <= 1 || !isHolderOf(pid, containerId)) return;
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        return;
      }
      // Gone (or a zombie of ours, whose command line reads empty) before the exit is told.
      const deadline = Date.now() + RELEASE_WAIT_MS;
      while (isHolderOf(pid, containerId) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    },
  };
}
