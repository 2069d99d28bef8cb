/**
 * The decision log: one JSON line per decision the broker takes (auth, attestation granted or
 * refused with what failed, resource released or refused and why, configuration reloaded or
 * kept), appended to <dir>/decisions.log and written to stderr. A line never carries a
 * resource's bytes, a session's cookie (sessions are named by a digest of it) or a key.
 *
 *   {"time": ISO-8601, "event": "auth"|"attest"|"resource"|"config"|"error",
 *    "outcome": "granted"|"refused"|"released"|"reloaded"|"kept"|"failed", "session"?: logId, ...}
 */
import { closeSync, constants, fstatSync, openSync, writeSync } from 'node:fs';
import { precondition } from '../common/errors.js';
import './reasons.js';

export type DecisionEvent = 'auth' | 'attest' | 'resource' | 'config' | 'error' | 'serve';
export type DecisionOutcome = 'granted' | 'refused' | 'released' | 'reloaded' | 'kept' | 'failed' | 'listening' | 'stopped' | 'note';

export interface Decision {
  event: DecisionEvent;
  outcome: DecisionOutcome;
  [key: string]: unknown;
}

/** Where decisions go; the broker's tests hand a memory sink. */
export interface DecisionSink {
  record(decision: Decision): void;
}

/** Pure: one log line. */
export function decisionLine(decision: Decision, nowMs: number): string {
  return `${JSON.stringify({ time: new Date(nowMs).toISOString(), ...decision })}\n`;
}

/** Appends to the log file (opened once, O_APPEND, no symlink followed) and copies to stderr. */
export class DecisionLog implements DecisionSink {
  private fd: number;

  constructor(
    file: string,
    private readonly stderr: NodeJS.WritableStream | null = process.stderr,
    private readonly now: () => number = Date.now,
  ) {
    this.fd = openSync(file, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
    if (!fstatSync(this.fd).isFile()) {
      closeSync(this.fd);
      throw precondition('BROKER_STATE_INVALID', `${file} is not a regular file`);
    }
  }

  record(decision: Decision): void {
    const line = decisionLine(decision, this.now());
    try {
      writeSync(this.fd, line);
    } catch (err) {
      // A full disk must not stop the broker answering; stderr still gets the line.
      this.stderr?.write(`${JSON.stringify({ event: 'error', outcome: 'failed', what: 'decision log write', error: String(err) })}\n`);
    }
    this.stderr?.write(line);
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}
