import { Buffer } from 'node:buffer';
import { Duplex } from 'node:stream';
import type { MessageCodec, MethodTable } from '../../../src/channel/index.js';

/** Two in-memory Duplex ends wired to each other (what a socketpair would be). */
export function duplexPair(): [Duplex, Duplex] {
  const make = (peer: () => Duplex): Duplex =>
    new Duplex({
      read() {},
      write(chunk: Buffer, _enc, cb) {
        peer().push(chunk);
        cb();
      },
      final(cb) {
        peer().push(null);
        cb();
      },
      // Like a socket: when one end goes, the other sees its connection close.
      destroy(err, cb) {
        peer().destroy();
        cb(err);
      },
    });
  const a: Duplex = make(() => b);
  const b: Duplex = make(() => a);
  return [a, b];
}

/** A JSON codec for test method tables (the channel does not care what the bytes mean). */
export const jsonCodec: MessageCodec = {
  encode: (_t, value) => Buffer.from(JSON.stringify(value ?? {}), 'utf8'),
  decode: (_t, bytes) => JSON.parse(Buffer.from(bytes).toString('utf8')) as unknown,
};

export interface TestMethods {
  Echo: { kind: 'unary'; request: { text: string; delayMs?: number }; response: { text: string } };
  Hang: { kind: 'unary'; request: { note: string }; response: { note: string } };
  Count: { kind: 'serverStream'; request: { n: number; size: number }; response: { i: number; blob: string } };
  Sum: { kind: 'clientStream'; request: { v: number }; response: { total: number } };
  Upper: { kind: 'bidi'; request: { text: string }; response: { text: string } };
  Fail: { kind: 'unary'; request: { note: string }; response: { note: string } };
}

export const TEST_TABLE: MethodTable<TestMethods> = {
  Echo: { kind: 'unary', request: 'Echo', response: 'Echo' },
  Hang: { kind: 'unary', request: 'Hang', response: 'Hang' },
  Count: { kind: 'serverStream', request: 'Count', response: 'Count' },
  Sum: { kind: 'clientStream', request: 'Sum', response: 'Sum' },
  Upper: { kind: 'bidi', request: 'Upper', response: 'Upper' },
  Fail: { kind: 'unary', request: 'Fail', response: 'Fail' },
};
