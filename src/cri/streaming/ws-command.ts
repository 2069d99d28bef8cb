/**
 * Exec and attach over WebSocket (`v4.channel.k8s.io`, `v5.channel.k8s.io`): every binary
 * message starts with its channel byte: 0 stdin, 1 stdout, 2 stderr, 3 error (the status), 4
 * resize (terminal-size JSON); in v5 a message on channel 255 carrying a channel number closes
 * that channel (the client's end of stdin). Writes wait for `ws.send`'s callback (backpressure);
 * stdin pauses the socket while its reader is behind.
 */
import { Buffer } from 'node:buffer';
import { Readable, Writable } from 'node:stream';
import type { WebSocket } from 'ws';
import type { CommandChannels, CommandResult } from '../../runtime/container/command-channels.js';
import { SizeQueue, statusBytes, TerminalSizeParser } from './channels.js';
import type { StdioRequest } from './requests.js';

export const Channel = { STDIN: 0, STDOUT: 1, STDERR: 2, ERROR: 3, RESIZE: 4, CLOSE: 255 } as const;

/** Send one message on `channel`; resolves once ws has written it. */
export function sendOn(ws: WebSocket, channel: number, data: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    if (ws.readyState !== ws.OPEN) return reject(new Error('the WebSocket is closed'));
    ws.send(Buffer.concat([Buffer.from([channel]), data]), { binary: true }, (err) => (err ? reject(err) : resolve()));
  });
}

function outChannel(ws: WebSocket, channel: number): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, callback) {
      sendOn(ws, channel, chunk).then(() => callback(), callback);
    },
  });
}

/** Channels of one WebSocket remote command connection. */
export function wsCommandChannels(ws: WebSocket, protocol: string, request: StdioRequest): CommandChannels {
  const abort = new AbortController();
  ws.on('close', () => abort.abort(new Error('the client closed the connection')));
  ws.on('error', () => {});
  const stdin = request.stdin
    ? new Readable({
        read() {
          ws.resume();
        },
      })
    : null;
  const resizes = request.tty ? new SizeQueue() : null;
  const parser = new TerminalSizeParser();
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    const bytes = isBinary ? data : Buffer.from(data);
    if (bytes.length === 0) return;
    const channel = bytes[0];
    const payload = bytes.subarray(1);
    if (channel === Channel.STDIN && stdin !== null && !stdin.readableEnded) {
      if (!stdin.push(payload)) ws.pause();
    } else if (channel === Channel.RESIZE && resizes !== null) {
      for (const size of parser.push(payload.toString('utf8'))) resizes.push(size);
    } else if (channel === Channel.CLOSE && protocol === 'v5.channel.k8s.io' && payload[0] === Channel.STDIN) {
      stdin?.push(null);
    }
  });
  ws.on('close', () => {
    if (stdin !== null && !stdin.readableEnded) stdin.push(null);
    resizes?.end();
  });
  const stdout = request.stdout ? outChannel(ws, Channel.STDOUT) : null;
  const stderr = request.stderr ? outChannel(ws, Channel.STDERR) : null;
  let finishing = false;
  return {
    stdin,
    stdout,
    stderr,
    resizes,
    signal: abort.signal,
    finish: async (result: CommandResult) => {
      if (finishing) return;
      finishing = true;
      await Promise.all([stdout, stderr].map((w) => (w === null ? undefined : new Promise<void>((resolve) => w.end(() => resolve())))));
      const status = statusBytes(protocol, result);
      if (status !== null) await sendOn(ws, Channel.ERROR, Buffer.from(status)).catch(() => undefined);
      resizes?.end();
      ws.close(1000);
    },
  };
}
