import { execFile } from 'node:child_process';
import { internal, notFound } from '../../../src/common/errors.js';

/** How the OCI runtime is invoked. */
export interface RuntimeOptions {
  /** The runtime's argv prefix: `['crun']` in the guest; tests may prefix a namespace entry. */
  command: string[];
  /** crun's state directory (`--root`). */
  stateDir: string;
  /** `cgroupfs` in the guest; `disabled` only for tests on a host whose cgroups are not ours. */
  cgroupManager: 'cgroupfs' | 'disabled';
  /**
   * `crun create --no-pivot`: needed when the agent's own root is the initramfs (rootfs), where
   * pivot_root(2) fails with EINVAL; chroot-like isolation is then weaker (MS_MOVE + chroot).
   */
  noPivot?: boolean;
}

/** Pure argv builders: every runtime call is an argument array, never a shell line. */
export class RuntimeArgv {
  constructor(private readonly options: RuntimeOptions) {}

  private base(logFile?: string): string[] {
    const args = [...this.options.command, `--root=${this.options.stateDir}`, `--cgroup-manager=${this.options.cgroupManager}`];
    if (logFile) args.push(`--log=file:${logFile}`);
    return args;
  }

  create(id: string, bundle: string, pidFile: string, logFile: string, consoleSocket?: string): string[] {
    const tty = consoleSocket ? [`--console-socket=${consoleSocket}`] : [];
    const pivot = this.options.noPivot ? ['--no-pivot'] : [];
    return [...this.base(logFile), 'create', `--bundle=${bundle}`, `--pid-file=${pidFile}`, ...pivot, ...tty, id];
  }

  /** `--detach`: the process is reparented to the reaper, which reports its exact status. */
  exec(id: string, processFile: string, pidFile: string, logFile: string, consoleSocket?: string): string[] {
    const tty = consoleSocket ? ['--tty', `--console-socket=${consoleSocket}`] : [];
    return [...this.base(logFile), 'exec', '--detach', `--process=${processFile}`, `--pid-file=${pidFile}`, ...tty, id];
  }

  start(id: string): string[] {
    return [...this.base(), 'start', id];
  }

  kill(id: string, signal: number, all: boolean): string[] {
    return [...this.base(), 'kill', ...(all ? ['--all'] : []), id, String(signal)];
  }

  delete(id: string): string[] {
    return [...this.base(), 'delete', '--force', id];
  }

  /** `pause`: the container's cgroup frozen. */
  pause(id: string): string[] {
    return [...this.base(), 'pause', id];
  }

  /** `resume`: the container's cgroup thawed. */
  resume(id: string): string[] {
    return [...this.base(), 'resume', id];
  }

  /** `update --resources=<file>`: the OCI linux.resources in the file, applied to the container's cgroup. */
  update(id: string, resourcesFile: string): string[] {
    return [...this.base(), 'update', `--resources=${resourcesFile}`, id];
  }

  state(id: string): string[] {
    return [...this.base(), 'state', id];
  }
}

/** Runs one runtime command to completion; a failure carries crun's stderr in the details. */
export function runRuntime(argv: string[], what: string): Promise<string> {
  const [file, ...args] = argv;
  return new Promise((resolve, reject) => {
    execFile(file!, args, { encoding: 'utf8', maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
      if (!err) {
        resolve(stdout);
        return;
      }
      const details = { argv, stderr: stderr.trim() };
      if (/does not exist|not found/i.test(stderr))
        reject(notFound('CONTAINER_NOT_FOUND', `The runtime does not know ${what}.`, { details }));
      else reject(internal('RUNTIME_FAILED', `The OCI runtime failed to ${what}.`, { cause: err, details }));
    });
  });
}

/**
 * Whether `/` is the initramfs (fs type `rootfs` in mountinfo): pivot_root(2) cannot move away
 * from it (crun create fails with "pivot_root: Invalid argument", measured in the guest), so the
 * runtime must run with `noPivot` unless the guest's init switched to another root first.
 */
export function rootIsInitramfs(mountinfo: string): boolean {
  for (const line of mountinfo.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!left || !right) continue;
    if (left.split(' ')[4] === '/') return right.split(' ')[0] === 'rootfs';
  }
  return false;
}
