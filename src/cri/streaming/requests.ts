/**
 * The CRI's Exec, Attach and PortForward requests, checked as the kubelet checks them and kept
 * (typed) behind a token until the client connects to the streaming server. Pure.
 */
import { invalid } from '../../common/errors.js';

/** What a client may ask for on an exec or attach stream. */
export interface StdioRequest {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

export type StreamRequest =
  | ({ kind: 'exec'; containerId: string; cmd: string[] } & StdioRequest)
  | ({ kind: 'attach'; containerId: string } & StdioRequest)
  | { kind: 'portforward'; sandboxId: string; ports: number[] };

interface RawStdio {
  container_id?: string;
  stdin?: boolean;
  stdout?: boolean;
  stderr?: boolean;
  tty?: boolean;
}

function stdio(raw: RawStdio, rpc: string): StdioRequest & { containerId: string } {
  const containerId = raw.container_id ?? '';
  if (containerId === '') throw invalid('STREAM_CONTAINER_ID_MISSING', `container_id is required for ${rpc}.`);
  const s = { stdin: raw.stdin === true, stdout: raw.stdout === true, stderr: raw.stderr === true, tty: raw.tty === true };
  if (s.tty && s.stderr)
    throw invalid('STREAM_TTY_WITH_STDERR', `tty and stderr cannot both be true in ${rpc} (a terminal has one output).`);
  if (!s.stdin && !s.stdout && !s.stderr) throw invalid('STREAM_NO_STDIO', `one of stdin, stdout, or stderr must be set in ${rpc}.`);
  return { containerId, ...s };
}

/** ExecRequest -> StreamRequest. */
export function decodeExecRequest(raw: RawStdio & { cmd?: string[] }): StreamRequest {
  const base = stdio(raw, 'Exec');
  const cmd = raw.cmd ?? [];
  if (cmd.length === 0) throw invalid('STREAM_CMD_EMPTY', 'cmd is empty; Exec needs a command.');
  return { kind: 'exec', ...base, cmd: [...cmd] };
}

/** AttachRequest -> StreamRequest (attach has no stderr of its own when the container has a tty). */
export function decodeAttachRequest(raw: RawStdio): StreamRequest {
  return { kind: 'attach', ...stdio(raw, 'Attach') };
}

/** PortForwardRequest -> StreamRequest; an empty port list allows any port the client names. */
export function decodePortForwardRequest(raw: { pod_sandbox_id?: string; port?: number[] }): StreamRequest {
  const sandboxId = raw.pod_sandbox_id ?? '';
  if (sandboxId === '') throw invalid('STREAM_SANDBOX_ID_MISSING', 'pod_sandbox_id is required for PortForward.');
  const ports = raw.port ?? [];
  for (const p of ports) {
    if (!Number.isInteger(p) || p < 1 || p > 65535) throw invalid('STREAM_PORT_INVALID', `port ${p} is not a TCP port (1-65535).`);
  }
  return { kind: 'portforward', sandboxId, ports: [...ports] };
}
