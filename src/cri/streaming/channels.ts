/**
 * What an exec or attach needs of its client, whatever the protocol (SPDY streams or WebSocket
 * channels): stdin, stdout, stderr, terminal sizes, a signal for the client going away, and the
 * final status. Also the status documents the k8s remote command protocols put on the error
 * stream, and the terminal-size JSON parser. Pure apart from the types.
 */
import type { CommandResult, TerminalSize } from '../../runtime/container/command-channels.js';

/** Protocols of the remote command subprotocol family, newest first. */
export const COMMAND_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io', 'channel.k8s.io'];
export const PORT_FORWARD_PROTOCOL = 'portforward.k8s.io';

/** Whether a protocol writes a JSON Status (v4 and later) rather than plain text. */
export function statusIsJson(protocol: string): boolean {
  return protocol === 'v4.channel.k8s.io' || protocol === 'v5.channel.k8s.io';
}

/**
 * The bytes for the error stream at the end of a command, or null when nothing is written
 * (success before v4). v4+: a metav1.Status; a non-zero exit is reason NonZeroExitCode with the
 * code as the message of an ExitCode cause (what kubectl and crictl turn into their exit code).
 */
export function statusBytes(protocol: string, result: CommandResult): string | null {
  const json = statusIsJson(protocol);
  if ('error' in result) {
    return json
      ? JSON.stringify({ metadata: {}, status: 'Failure', message: result.error, reason: 'InternalError', code: 500 })
      : result.error;
  }
  if (result.exitCode === 0) return json ? JSON.stringify({ metadata: {}, status: 'Success' }) : null;
  const cmd = result.cmd === undefined ? '' : `error executing command [${result.cmd.join(' ')}], `;
  const message = `command terminated with non-zero exit code: ${cmd}exit code ${result.exitCode}`;
  if (!json) return message;
  return JSON.stringify({
    metadata: {},
    status: 'Failure',
    message,
    reason: 'NonZeroExitCode',
    details: { causes: [{ reason: 'ExitCode', message: String(result.exitCode) }] },
  });
}

/**
 * Terminal sizes from a byte stream of concatenated JSON objects (`{"Width":80,"Height":24}`,
 * as Go's json.Encoder writes them, newline separated or not). Keeps a partial object between
 * calls; anything that is not an object with two numbers is skipped.
 */
export class TerminalSizeParser {
  private text = '';

  push(chunk: string): TerminalSize[] {
    this.text += chunk;
    const sizes: TerminalSize[] = [];
    for (;;) {
      const start = this.text.indexOf('{');
      if (start < 0) {
        this.text = '';
        return sizes;
      }
      const end = this.text.indexOf('}', start);
      if (end < 0) {
        this.text = this.text.slice(start);
        if (this.text.length > 4096) this.text = '';
        return sizes;
      }
      const candidate = this.text.slice(start, end + 1);
      this.text = this.text.slice(end + 1);
      try {
        const v = JSON.parse(candidate) as { Width?: unknown; Height?: unknown };
        if (typeof v.Width === 'number' && typeof v.Height === 'number') sizes.push({ width: v.Width, height: v.Height });
      } catch {
        // not a size: skipped
      }
    }
  }
}

/** An unbounded-by-design but tiny queue: terminal sizes only (the newest matters). */
export class SizeQueue implements AsyncIterable<TerminalSize> {
  private items: TerminalSize[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  push(size: TerminalSize): void {
    // Only the latest size matters; an old one still queued is replaced.
    if (this.items.length > 0) this.items[this.items.length - 1] = size;
    else this.items.push(size);
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TerminalSize> {
    for (;;) {
      while (this.items.length > 0) yield this.items.shift()!;
      if (this.ended) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}
