/**
 * src/measure/tpm-reader.ts: big-endian fields and TPM2Bs read in order, and a structure that ends
 * early or goes on after its end reported through the caller's `fail`, never read past.
 */
import { describe, expect, it } from 'vitest';
import { TpmReader, type TpmReadProblem } from '../../../src/measure/tpm-reader.js';

const failing = (p: TpmReadProblem): never => {
  throw Object.assign(new Error(p.kind), { problem: p });
};
const problem = (fn: () => unknown): TpmReadProblem => {
  try {
    fn();
  } catch (err) {
    return (err as { problem: TpmReadProblem }).problem;
  }
  throw new Error('expected a failure');
};

describe('TpmReader', () => {
  it('reads u8, u16, u32, u64 big endian, a TPM2B and what was read since an offset', () => {
    const r = new TpmReader(Buffer.from('01' + '0203' + '04050607' + '08090a0b0c0d0e0f' + '0002aabb' + 'cc', 'hex'), failing);
    expect(r.u8()).toBe(1);
    const start = r.offset;
    expect(r.u16()).toBe(0x0203);
    expect(r.u32()).toBe(0x04050607);
    expect(r.u64()).toBe(0x08090a0b0c0d0e0fn);
    expect(r.since(start).toString('hex')).toBe('02030405060708090a0b0c0d0e0f');
    expect(r.sized().toString('hex')).toBe('aabb');
    expect(r.left).toBe(1);
    expect(problem(() => r.end())).toEqual({ kind: 'trailing', extra: 1 });
    expect(r.bytes(1).toString('hex')).toBe('cc');
    r.end();
  });
  it('a TPM2B longer than what is left is short, reported where it stopped', () => {
    const r = new TpmReader(Buffer.from('0005aabb', 'hex'), failing);
    expect(problem(() => r.sized())).toEqual({ kind: 'short', at: 2, need: 5, has: 2 });
    expect(problem(() => new TpmReader(Buffer.alloc(3), failing).u32())).toEqual({ kind: 'short', at: 0, need: 4, has: 3 });
  });
});
