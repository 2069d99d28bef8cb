import protobuf from 'protobufjs';
import { criReflectionRoot } from '../../src/cri/proto.js';
import { jsonNameOf } from '../../src/cri/protojson.js';

/**
 * Write a decoded CRI message (snake_case, proto-loader shape) as proto3 JSON (lowerCamelCase
 * names, 64-bit integers as strings), the form `kata-ts plan --request` reads. Scalars at their
 * default are left out as protobuf JSON printers do; enums are always written (by name) and
 * messages that are present stay present (`{}`), so presence survives the round trip.
 */
export function encodeProtoJson(typeName: string, value: unknown): Record<string, unknown> {
  const type = criReflectionRoot().lookupType(typeName);
  return encodeMessage(type, value as Record<string, unknown>);
}

const LONG_TYPES = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64']);

function encodeScalar(field: protobuf.Field, value: unknown): unknown {
  const resolved = field.resolvedType;
  if (resolved instanceof protobuf.Type) return encodeMessage(resolved, value as Record<string, unknown>);
  if (resolved instanceof protobuf.Enum) return typeof value === 'number' ? (resolved.valuesById[value] ?? value) : value;
  if (LONG_TYPES.has(field.type)) return String(value);
  return value;
}

function isDefaultScalar(field: protobuf.Field, value: unknown): boolean {
  if (field.resolvedType !== null) return false; // messages and enums are always written
  if (field.partOf !== null) return false; // proto3 `optional`: presence matters
  return value === '' || value === 0 || value === '0' || value === false;
}

function encodeMessage(type: protobuf.Type, object: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const field of type.fieldsArray) {
    const value = object[field.name];
    if (value === undefined || value === null) continue;
    const key = jsonNameOf(field.name);
    if (field.map) {
      const entries = Object.entries(value as Record<string, unknown>);
      if (entries.length > 0) out[key] = Object.fromEntries(entries.map(([k, v]) => [k, encodeScalar(field, v)]));
    } else if (field.repeated) {
      const items = value as unknown[];
      if (items.length > 0) out[key] = items.map((v) => encodeScalar(field, v));
    } else if (!isDefaultScalar(field, value)) {
      out[key] = encodeScalar(field, value);
    }
  }
  return out;
}
