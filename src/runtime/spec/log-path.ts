import { invalid } from '../../common/errors.js';

/** Linux's NAME_MAX, and shares of its PATH_MAX (4096) for the directory and the path inside it. */
const MAX_NAME_BYTES = 255;
const MAX_LOG_DIRECTORY_BYTES = 3072;
const MAX_LOG_PATH_BYTES = 1023;

function tooLong(p: string, maxBytes: number): boolean {
  return Buffer.byteLength(p) > maxBytes || p.split('/').some((s) => Buffer.byteLength(s) > MAX_NAME_BYTES);
}

/**
 * A pod's log_directory: empty (no logs) or an absolute, normalised path (no `.`, `..` or empty
 * segment, no trailing "/", not "/" itself). The kubelet sends `/var/log/pods/<namespace>_<name>_<uid>`
 * (critest a temporary directory); a `..` segment or a NUL could only point elsewhere, and a path
 * that is not normalised is not one the kubelet made.
 */
export function checkLogDirectory(dir: string, field: string): void {
  if (dir === '') return;
  const segments = dir.split('/').slice(1);
  if (!dir.startsWith('/') || dir.includes('\0') || segments.some((s) => s === '' || s === '.' || s === '..')) {
    throw invalid(
      'SANDBOX_LOG_DIRECTORY_INVALID',
      `${field} must be an absolute, normalised path (no ".", ".." or empty segment, not "/")`,
    );
  }
  if (tooLong(dir, MAX_LOG_DIRECTORY_BYTES))
    throw invalid(
      'SANDBOX_LOG_DIRECTORY_INVALID',
      `${field} must be at most ${MAX_LOG_DIRECTORY_BYTES} bytes, each segment at most ${MAX_NAME_BYTES}`,
    );
}

/**
 * A container's log_path, relative to its pod's log_directory (the kubelet sends
 * `<container>/<restart count>.log`): never absolute, never with a `..` segment or a NUL, so the
 * file the daemon writes, as root, stays inside the pod's log directory; and a file name, short
 * enough for open(2).
 */
export function checkLogPath(logPath: string, field: string): void {
  if (logPath === '') return;
  if (logPath.startsWith('/') || logPath.includes('\0') || logPath.split('/').includes('..')) {
    throw invalid('CONTAINER_LOG_PATH_INVALID', `${field} must be a relative path inside the pod's log directory, without ".." segments`);
  }
  // "." or "app/" names a directory, never a file to append to.
  const last = logPath.split('/').at(-1);
  if (last === '' || last === '.') throw invalid('CONTAINER_LOG_PATH_INVALID', `${field} must name a file, not a directory`);
  // What open(2) would refuse as ENAMETOOLONG at StartContainer, refused at CreateContainer instead.
  if (tooLong(logPath, MAX_LOG_PATH_BYTES))
    throw invalid(
      'CONTAINER_LOG_PATH_INVALID',
      `${field} must be at most ${MAX_LOG_PATH_BYTES} bytes, each segment at most ${MAX_NAME_BYTES}`,
    );
}
