/**
 * `start`'s side of the node shim server's control socket (node-server.ts): one JSON line out,
 * one JSON line back, within a bound.
 */
import net from 'node:net';
import { timedOut, unavailable } from '../common/errors.js';
import type { NodeRequest } from './node-server.js';
import './reasons.js';

/** The node server's answer to a request that failed: its reason code and sentence. */
export interface NodeRequestError {
  code: string;
  message: string;
}

/** Send `request` on the control socket; resolves when it is answered ok, rejects with SHIM_NODE_FAILED otherwise. */
export function nodeRequest(controlPath: string, request: NodeRequest, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(controlPath);
    let buf = '';
    let settled = false;
    const settle = (err?: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      if (err === undefined) resolve();
      else reject(err);
    };
    const timer = setTimeout(
      () => settle(timedOut('SHIM_NODE_FAILED', `the node shim server did not answer at ${controlPath} in time.`)),
      timeoutMs,
    );
    sock.setEncoding('utf8');
    sock.once('connect', () => sock.write(`${JSON.stringify(request)}\n`));
    sock.on('data', (chunk: string) => {
      buf += chunk;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      let answer: { ok?: boolean; error?: NodeRequestError };
      try {
        answer = JSON.parse(buf.slice(0, nl)) as typeof answer;
      } catch {
        settle(unavailable('SHIM_NODE_FAILED', 'the node shim server answered something that is not JSON.'));
        return;
      }
      if (answer.ok === true) settle();
      else
        settle(
          unavailable('SHIM_NODE_FAILED', `the node shim server refused: ${answer.error?.message ?? 'no reason given'}`, {
            details: { code: answer.error?.code ?? '' },
          }),
        );
    });
    sock.once('error', (err) =>
      settle(unavailable('SHIM_NODE_FAILED', `the node shim server is not reachable at ${controlPath}: ${err.message}.`)),
    );
    sock.once('close', () =>
      settle(unavailable('SHIM_NODE_FAILED', `the node shim server closed the control connection without answering.`)),
    );
  });
}
