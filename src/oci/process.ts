/**
 * The process part of a container: argv by Kubernetes' entrypoint rules, the environment merged
 * over the image's, the working directory and the stop signal. Pure.
 */
import { invalid, type KataError } from '../common/errors.js';
import type { OciContainerInput, OciImageInput } from './input.js';
import type { OciReason } from './reasons.js';

/** The PATH a container gets when neither the image nor the request sets one (as Docker's). */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** An invalid-argument error whose message starts with the field it is about. */
export function fieldError(reason: OciReason, field: string, sentence: string): KataError {
  return invalid(reason, `${field} ${sentence}`, { details: { field } });
}

function checkStrings(values: readonly string[], field: string): void {
  values.forEach((v, i) => {
    if (v.includes('\0')) throw fieldError('OCI_NUL_IN_STRING', `${field}[${i}]`, 'contains a NUL byte');
  });
}

/**
 * Kubernetes' rules (pod spec `command`/`args` against the image's Entrypoint/Cmd): command
 * replaces the Entrypoint and drops Cmd; args replace Cmd; neither keeps Entrypoint + Cmd. The
 * result is an argv array handed to execve as is: nothing here ever goes through a shell.
 */
export function resolveArgs(container: OciContainerInput, image: OciImageInput | null | undefined): string[] {
  const command = container.command ?? [];
  const args = container.args ?? [];
  checkStrings(command, 'container.command');
  checkStrings(args, 'container.args');
  const entrypoint = image?.Entrypoint ?? [];
  const cmd = image?.Cmd ?? [];
  let argv: string[];
  if (command.length > 0) argv = [...command, ...args];
  else if (args.length > 0) argv = [...entrypoint, ...args];
  else argv = [...entrypoint, ...cmd];
  if (argv.length === 0) {
    throw fieldError('OCI_NO_COMMAND', 'container.command', 'is empty and the image has no Entrypoint or Cmd');
  }
  if (argv[0] === '') throw fieldError('OCI_NO_COMMAND', 'container.command', 'starts with an empty program name');
  return argv;
}

function splitEnv(entry: string): [string, string] {
  const eq = entry.indexOf('=');
  return eq < 0 ? [entry, ''] : [entry.slice(0, eq), entry.slice(eq + 1)];
}

/**
 * The environment: built-ins first (PATH when nobody sets it, HOSTNAME, TERM with a tty, HOME
 * from the user's passwd entry), then the image's Env, then the request's envs. A later source
 * replaces an earlier value in place, so the order of first appearance is kept and the request
 * always wins; new keys are appended in request order.
 */
export function mergeEnv(
  container: OciContainerInput,
  image: OciImageInput | null | undefined,
  builtins: { hostname?: string; home?: string },
): string[] {
  const merged = new Map<string, string>();
  const imageEnv = image?.Env ?? [];
  const request = container.envs ?? [];
  request.forEach((kv, i) => {
    if (kv.key === '' || kv.key.includes('=')) {
      throw fieldError('OCI_ENV_INVALID', `container.envs[${i}].key`, 'must be non-empty and contain no "="');
    }
    checkStrings([kv.key, kv.value], `container.envs[${i}]`);
  });
  const setByAnyone = (key: string): boolean => request.some((kv) => kv.key === key) || imageEnv.some((e) => splitEnv(e)[0] === key);
  if (!setByAnyone('PATH')) merged.set('PATH', DEFAULT_PATH);
  if (builtins.hostname !== undefined && builtins.hostname !== '') merged.set('HOSTNAME', builtins.hostname);
  if (container.tty === true) merged.set('TERM', 'xterm');
  if (builtins.home !== undefined && !setByAnyone('HOME')) merged.set('HOME', builtins.home);
  for (const entry of imageEnv) {
    const [key, value] = splitEnv(entry);
    if (key !== '') merged.set(key, value);
  }
  for (const kv of request) merged.set(kv.key, kv.value);
  return [...merged].map(([k, v]) => `${k}=${v}`);
}

/** The request's working directory, else the image's, else `/`; it must be absolute. */
export function resolveCwd(container: OciContainerInput, image: OciImageInput | null | undefined): string {
  const fromRequest = container.working_dir ?? '';
  const cwd = fromRequest !== '' ? fromRequest : image?.WorkingDir || '/';
  if (!cwd.startsWith('/')) {
    const field = fromRequest !== '' ? 'container.working_dir' : 'image.WorkingDir';
    throw fieldError('OCI_CWD_RELATIVE', field, `is "${cwd}", not an absolute path`);
  }
  return cwd;
}

/** The request's stop signal (unless RUNTIME_DEFAULT), else the image's, else SIGTERM. */
export function resolveStopSignal(container: OciContainerInput, image: OciImageInput | null | undefined): string {
  const requested = container.stop_signal ?? '';
  if (requested !== '' && requested !== 'RUNTIME_DEFAULT') return requested;
  const fromImage = image?.StopSignal ?? '';
  if (fromImage === '') return 'SIGTERM';
  if (/^\d+$/.test(fromImage)) return fromImage;
  return fromImage.toUpperCase().startsWith('SIG') ? fromImage.toUpperCase() : `SIG${fromImage.toUpperCase()}`;
}
