/**
 * Exec and attach over SPDY as the kubelet serves them (k8s remotecommand): the client opens one
 * stream per channel, typed by its `streamType` header (error, stdin, stdout, stderr, and resize
 * from v3 on with a tty); once every stream the request implies has arrived (within
 * `streamCreationTimeoutMs`) the command runs; at the end stdout/stderr get FIN, the error stream
 * gets the status, and the connection goes away.
 */

import type { Duplex } from 'node:stream';
import { finished } from 'node:stream/promises';
import type { Logger } from '../../common/logger.js';
import type { CommandChannels, CommandResult } from '../../runtime/container/command-channels.js';
import { SpdySession, type SpdyStream } from '../../spdy/session.js';
import { SizeQueue, statusBytes, TerminalSizeParser } from './channels.js';
import type { StdioRequest } from './requests.js';

export interface SpdyCommandOptions {
  socket: Duplex;
  protocol: string;
  request: StdioRequest;
  streamCreationTimeoutMs: number;
  logger: Logger;
  run: (channels: CommandChannels) => Promise<void>;
}

/** Serve one remote command connection; resolves when it is over. Returns the session for shutdown. */
export function serveSpdyCommand(options: SpdyCommandOptions): { session: SpdySession; done: Promise<void> } {
  const { request, protocol } = options;
  const expected = new Set<string>(['error']);
  if (request.stdin) expected.add('stdin');
  if (request.stdout) expected.add('stdout');
  if (request.stderr) expected.add('stderr');
  if (request.tty && protocol !== 'channel.k8s.io' && protocol !== 'v2.channel.k8s.io') expected.add('resize');
  const streams = new Map<string, SpdyStream>();
  let resolveAll!: () => void;
  const all = new Promise<void>((resolve) => {
    resolveAll = resolve;
  });
  const session = new SpdySession(options.socket, {
    maxStreams: 8,
    onStream: (stream) => {
      const type = stream.header('streamtype') ?? '';
      if (!expected.has(type) || streams.has(type)) return false;
      streams.set(type, stream);
      if (streams.size === expected.size) resolveAll();
      return true;
    },
  });
  const abort = new AbortController();
  session.once('close', () => abort.abort(new Error('the client closed the connection')));
  const done = (async () => {
    const timer = setTimeout(() => abort.abort(new Error('streams were not created in time')), options.streamCreationTimeoutMs);
    try {
      await Promise.race([all, new Promise((_, reject) => abort.signal.addEventListener('abort', () => reject(abort.signal.reason)))]);
    } catch (err) {
      options.logger.info({ err: String(err), protocol }, 'remote command connection ended before its streams were created');
      session.close();
      return;
    } finally {
      clearTimeout(timer);
    }
    options.logger.debug({ protocol, streams: [...streams.keys()] }, 'remote command streams open');
    const errorStream = streams.get('error')!;
    errorStream.resume(); // the client never writes here; keep its window open
    const resizes = streams.has('resize') ? new SizeQueue() : null;
    const resizeStream = streams.get('resize');
    if (resizeStream !== undefined && resizes !== null) {
      const parser = new TerminalSizeParser();
      resizeStream.on('data', (chunk: Buffer) => {
        for (const size of parser.push(chunk.toString('utf8'))) resizes.push(size);
      });
      resizeStream.on('end', () => resizes.end());
      resizeStream.on('close', () => resizes.end());
    }
    for (const s of streams.values()) s.on('error', () => {});
    let finishing = false;
    const channels: CommandChannels = {
      stdin: streams.get('stdin') ?? null,
      stdout: streams.get('stdout') ?? null,
      stderr: streams.get('stderr') ?? null,
      resizes,
      signal: abort.signal,
      finish: async (result: CommandResult) => {
        if (finishing) return;
        finishing = true;
        for (const out of [channels.stdout, channels.stderr]) if (out !== null && !out.writableEnded) out.end();
        await Promise.all(
          [channels.stdout, channels.stderr].map((out) =>
            out === null ? undefined : finished(out, { readable: false }).catch(() => undefined),
          ),
        );
        const status = statusBytes(protocol, result);
        if (status !== null && !errorStream.destroyed) errorStream.write(status);
        if (!errorStream.destroyed) errorStream.end();
        await finished(errorStream, { readable: false }).catch(() => undefined);
        resizes?.end();
        session.close();
      },
    };
    try {
      await options.run(channels);
    } catch (err) {
      await channels.finish({ error: err instanceof Error ? err.message : String(err) });
    }
  })();
  return { session, done };
}
