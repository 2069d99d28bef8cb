import { invalid } from '../../common/errors.js';

/**
 * A pod's log_directory: empty (no logs) or an absolute, normalised path. The kubelet sends
 * `/var/log/pods/<namespace>_<name>_<uid>`; a `..` segment or a NUL could only point elsewhere.
 */
export function checkLogDirectory(dir: string, field: string): void {
  if (dir === '') return;
  if (!dir.startsWith('/') || dir.includes('\0') || dir.split('/').includes('..')) {
    throw invalid('SANDBOX_LOG_DIRECTORY_INVALID', `${field} must be an absolute path without ".." segments`);
  }
}

/**
 * A container's log_path, relative to its pod's log_directory (the kubelet sends
 * `<container>/<restart count>.log`): never absolute, never with a `..` segment or a NUL, so the
 * file the daemon writes, as root, stays inside the pod's log directory.
 */
export function checkLogPath(logPath: string, field: string): void {
  if (logPath === '') return;
  if (logPath.startsWith('/') || logPath.includes('\0') || logPath.split('/').includes('..')) {
    throw invalid('CONTAINER_LOG_PATH_INVALID', `${field} must be a relative path inside the pod's log directory, without ".." segments`);
  }
}
