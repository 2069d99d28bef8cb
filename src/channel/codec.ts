import { Buffer } from 'node:buffer';
import protobuf from 'protobufjs';

/** Turns messages of a named type into bytes and back. */
export interface MessageCodec {
  encode(typeName: string, value: unknown): Buffer;
  decode(typeName: string, bytes: Uint8Array): unknown;
}

/**
 * A codec over a protobufjs JSON descriptor (the generated AGENT_DESCRIPTOR), so no .proto file
 * is read at run time. Decoded messages have every scalar (defaults filled), enums as names,
 * 64-bit integers as numbers, bytes as Buffers and absent sub-messages as null, matching the
 * generated interfaces.
 */
export function protobufCodec(descriptor: Record<string, unknown>): MessageCodec {
  const root = protobuf.Root.fromJSON(descriptor as protobuf.INamespace);
  root.resolveAll();
  const types = new Map<string, protobuf.Type>();
  const typeOf = (name: string): protobuf.Type => {
    let t = types.get(name);
    if (t === undefined) {
      t = root.lookupType(name);
      types.set(name, t);
    }
    return t;
  };
  return {
    encode(typeName, value) {
      const t = typeOf(typeName);
      const bytes = t.encode(t.fromObject(value as Record<string, unknown>)).finish();
      return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    },
    decode(typeName, bytes) {
      const t = typeOf(typeName);
      return t.toObject(t.decode(bytes), { enums: String, longs: Number, defaults: true, arrays: true, objects: true });
    },
  };
}
