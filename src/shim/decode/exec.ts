/**
 * An Exec request's process (containerd sends the OCI process as JSON: the container's own with
 * its args replaced) -> a small typed exec spec, validated once (pure).
 */
import { invalid } from '../../common/errors.js';
import { envsOf } from './container.js';
import './reasons.js';
import { parseOciProcess } from './spec.js';

export interface ExecSpec {
  /** argv, never empty; no shell is involved. */
  args: string[];
  /** `KEY=VALUE`, in order. */
  env: string[];
  /** Absolute. */
  cwd: string;
  terminal: boolean;
  user: { uid: number; gid: number; additionalGids: number[] };
  /** The terminal's size when the process starts (terminal only). */
  consoleSize?: { height: number; width: number };
}

/** The exec's process (untrusted JSON) -> its ExecSpec, or INVALID_ARGUMENT naming the `spec.*` field at fault. */
export function decodeExecProcess(process: unknown): ExecSpec {
  const p = parseOciProcess(process);
  const args = p.args ?? [];
  if (args.length === 0)
    throw invalid('CONTAINER_EXEC_EMPTY', 'spec.args must not be empty; an exec needs a command', { details: { field: 'spec.args' } });
  if (args[0] === '') throw invalid('CONTAINER_EXEC_EMPTY', 'spec.args[0] must name a program', { details: { field: 'spec.args[0]' } });
  if (!p.cwd.startsWith('/')) {
    throw invalid('SHIM_SPEC_INVALID', `spec.cwd is ${JSON.stringify(p.cwd)}, not an absolute path`, { details: { field: 'spec.cwd' } });
  }
  const env = p.env ?? [];
  envsOf(env, 'spec.env');
  const spec: ExecSpec = {
    args: [...args],
    env: [...env],
    cwd: p.cwd,
    terminal: p.terminal === true,
    user: { uid: p.user.uid, gid: p.user.gid, additionalGids: [...(p.user.additionalGids ?? [])] },
  };
  if (p.terminal === true && p.consoleSize !== undefined) spec.consoleSize = { height: p.consoleSize.height, width: p.consoleSize.width };
  return spec;
}
