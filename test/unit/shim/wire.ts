/**
 * A few lines of protobuf wire format, written out by hand, so the tests can check field numbers
 * and wire types against bytes that protobufjs did not produce.
 */
import { Buffer } from 'node:buffer';

/** An unsigned varint (a bigint, for 64-bit values). */
export function varint(value: number | bigint): Buffer {
  let v = BigInt(value);
  const out: number[] = [];
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) byte |= 0x80;
    out.push(byte);
  } while (v > 0n);
  return Buffer.from(out);
}

/** A varint field (wire type 0): uint32, uint64, int64 >= 0, bool, enum. */
export function vfield(fieldNumber: number, value: number | bigint | boolean): Buffer {
  return Buffer.concat([varint(fieldNumber << 3), varint(typeof value === 'boolean' ? Number(value) : value)]);
}

/** A length-delimited field (wire type 2): string, bytes, embedded message, packed list. */
export function lfield(fieldNumber: number, body: Buffer | string): Buffer {
  const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
  return Buffer.concat([varint((fieldNumber << 3) | 2), varint(bytes.length), bytes]);
}

export const cat = (...parts: Buffer[]): Buffer => Buffer.concat(parts);
