import type { MessageTypeDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { invalid } from '../common/errors.js';
import { criReflectionRoot, loadCriPackage } from './proto.js';

/**
 * Reading CRI messages written as JSON (the proto3 JSON mapping), for `kata-ts plan` and fixtures.
 *
 * protobufjs' own `fromObject` is lenient: it ignores unknown keys and coerces wrong types
 * silently, which would turn a typo in a pod file into a quietly different plan. So the JSON is
 * first walked against the reflected schema here, field by field, and every problem names its
 * JSON path. The checked value is then encoded to protobuf bytes and decoded by the very
 * deserializer grpc-js uses for requests (proto-loader with PROTO_LOADER_OPTIONS), so callers get
 * exactly the object a server handler would receive: snake_case keys, enums by name, int64 as
 * strings, defaults filled in.
 */

/** The proto3 JSON name of a field: underscores dropped, the letter after each one upper-cased. */
export function jsonNameOf(fieldName: string): string {
  return fieldName.replace(/_+(.?)/g, (_m, next: string) => next.toUpperCase());
}

const fieldIndexes = new WeakMap<protobuf.Type, Map<string, protobuf.Field>>();

/** Both spellings of every field of `type`: original name and lowerCamelCase JSON name. */
function fieldIndex(type: protobuf.Type): Map<string, protobuf.Field> {
  let index = fieldIndexes.get(type);
  if (index === undefined) {
    index = new Map();
    for (const field of type.fieldsArray) {
      index.set(field.name, field);
      index.set(jsonNameOf(field.name), field);
    }
    fieldIndexes.set(type, index);
  }
  return index;
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') return `the string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)}`;
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${String(value)}`;
}

function fail(path: string, expectation: string, value: unknown): never {
  throw invalid('PROTOJSON_INVALID', `${path} must be ${expectation}, got ${describeValue(value)}.`, {
    details: { path },
  });
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

const INT_RANGES: Record<string, readonly [bigint, bigint]> = {
  int32: [-(2n ** 31n), 2n ** 31n - 1n],
  sint32: [-(2n ** 31n), 2n ** 31n - 1n],
  sfixed32: [-(2n ** 31n), 2n ** 31n - 1n],
  uint32: [0n, 2n ** 32n - 1n],
  fixed32: [0n, 2n ** 32n - 1n],
  int64: [-(2n ** 63n), 2n ** 63n - 1n],
  sint64: [-(2n ** 63n), 2n ** 63n - 1n],
  sfixed64: [-(2n ** 63n), 2n ** 63n - 1n],
  uint64: [0n, 2n ** 64n - 1n],
  fixed64: [0n, 2n ** 64n - 1n],
};

const FLOAT_MAX = 3.4028234663852886e38;

/** proto3 JSON accepts integers as numbers or as decimal strings (the only way to carry big int64). */
function convertInteger(scalar: string, range: readonly [bigint, bigint], value: unknown, path: string): number | string {
  let big: bigint | undefined;
  if (typeof value === 'number' && Number.isInteger(value)) big = BigInt(value);
  else if (typeof value === 'string' && /^-?\d+$/.test(value)) big = BigInt(value);
  const expectation = `an integer (${scalar}) between ${range[0]} and ${range[1]}`;
  if (big === undefined || big < range[0] || big > range[1]) fail(path, expectation, value);
  // 64-bit values travel as decimal strings so protobufjs parses them with Long, losslessly.
  return scalar.endsWith('64') ? big.toString() : Number(big);
}

function convertFloat(scalar: string, value: unknown, path: string): number {
  let n: number | undefined;
  if (typeof value === 'number') n = value;
  else if (value === 'NaN' || value === 'Infinity' || value === '-Infinity') n = Number(value);
  else if (typeof value === 'string' && /^-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(value)) n = Number(value);
  if (n === undefined) return fail(path, `a number (${scalar})`, value);
  if (scalar === 'float' && Number.isFinite(n) && Math.abs(n) > FLOAT_MAX) fail(path, 'a number within float range', value);
  return n;
}

function convertBytes(value: unknown, path: string): Buffer {
  // Standard or URL-safe base64, padding optional.
  if (typeof value !== 'string' || !/^[A-Za-z0-9+/_-]*={0,2}$/.test(value) || value.replace(/=+$/, '').length % 4 === 1) {
    return fail(path, 'base64 text (bytes)', value);
  }
  return Buffer.from(value.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
}

function convertEnum(enumType: protobuf.Enum, value: unknown, path: string): string | number {
  if (typeof value === 'string' && Object.hasOwn(enumType.values, value)) return value;
  if (typeof value === 'number' && Number.isInteger(value) && enumType.valuesById[value] !== undefined) return value;
  return fail(
    path,
    `a value of enum ${enumType.fullName.slice(1)} (a name such as ${Object.keys(enumType.values)[0] ?? '?'}, or its number)`,
    value,
  );
}

function convertScalar(scalar: string, value: unknown, path: string): unknown {
  const range = INT_RANGES[scalar];
  if (range !== undefined) return convertInteger(scalar, range, value, path);
  switch (scalar) {
    case 'double':
    case 'float':
      return convertFloat(scalar, value, path);
    case 'bool':
      return typeof value === 'boolean' ? value : fail(path, 'true or false (bool)', value);
    case 'string':
      return typeof value === 'string' ? value : fail(path, 'a string', value);
    case 'bytes':
      return convertBytes(value, path);
    default:
      throw invalid('PROTOJSON_INVALID', `${path} has the unsupported scalar type ${scalar}.`, { details: { path } });
  }
}

/** Convert one (non-repeated) value of a field's element type. */
function convertValue(field: protobuf.Field, value: unknown, path: string): unknown {
  const resolved = field.resolvedType;
  if (resolved instanceof protobuf.Type) return convertMessage(resolved, value, path);
  if (resolved instanceof protobuf.Enum) return convertEnum(resolved, value, path);
  return convertScalar(field.type, value, path);
}

function convertMapKey(keyType: string, key: string, path: string): string {
  if (keyType === 'string') return key;
  if (keyType === 'bool') return key === 'true' || key === 'false' ? key : fail(path, 'a map key "true" or "false"', key);
  return String(convertScalar(keyType, key, path));
}

function convertField(field: protobuf.Field, value: unknown, path: string): unknown {
  if (field instanceof protobuf.MapField) {
    if (!isPlainObject(value)) return fail(path, 'an object (map)', value);
    const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
    for (const [key, entry] of Object.entries(value)) {
      const entryPath = `${path}[${JSON.stringify(key)}]`;
      if (entry === null) fail(entryPath, 'a map value', entry);
      out[convertMapKey(field.keyType, key, entryPath)] = convertValue(field, entry, entryPath);
    }
    return out;
  }
  if (field.repeated) {
    if (!Array.isArray(value)) return fail(path, 'an array (repeated field)', value);
    return value.map((element: unknown, i) => {
      const elementPath = `${path}[${i}]`;
      if (element === null) fail(elementPath, 'an element', element);
      return convertValue(field, element, elementPath);
    });
  }
  return convertValue(field, value, path);
}

function convertMessage(type: protobuf.Type, json: unknown, path: string): Record<string, unknown> {
  const typeName = type.fullName.slice(1);
  if (!isPlainObject(json)) return fail(path, `an object (${typeName})`, json);
  const index = fieldIndex(type);
  const out: Record<string, unknown> = {};
  const spelledAs = new Map<string, string>();
  for (const [key, value] of Object.entries(json)) {
    const keyPath = path === '' ? key : `${path}.${key}`;
    const field = index.get(key);
    if (field === undefined) {
      throw invalid('PROTOJSON_INVALID', `${keyPath} is not a field of ${typeName}.`, { details: { path: keyPath } });
    }
    const earlier = spelledAs.get(field.name);
    if (earlier !== undefined) {
      throw invalid('PROTOJSON_INVALID', `${keyPath} sets field ${field.name} of ${typeName} again (already set as ${earlier}).`, {
        details: { path: keyPath },
      });
    }
    spelledAs.set(field.name, key);
    // proto3 JSON: null stands for the field's default, i.e. "not set".
    if (value === null) continue;
    const oneof = field.partOf;
    if (oneof !== null && oneof.fieldsArray.length > 1) {
      const rival = oneof.fieldsArray.find((f) => f !== field && out[f.name] !== undefined);
      if (rival !== undefined) {
        throw invalid('PROTOJSON_INVALID', `${keyPath} conflicts with ${rival.name}: both belong to oneof ${oneof.name} of ${typeName}.`, {
          details: { path: keyPath },
        });
      }
    }
    out[field.name] = convertField(field, value, keyPath);
  }
  return out;
}

/** proto-loader's definition of message `name`, whose deserializer grpc-js uses on requests. */
function messageDefinition(name: string): MessageTypeDefinition<object, object> | undefined {
  const definition = loadCriPackage().packageDefinition[name];
  if (definition === undefined || definition.format !== 'Protocol Buffer 3 DescriptorProto') return undefined;
  return definition as MessageTypeDefinition<object, object>;
}

/**
 * Decode `json` (already parsed) as the message `typeName` (fully qualified, e.g.
 * `runtime.v1.RunPodSandboxRequest`) and return the object grpc-js would hand a server handler.
 * Field keys may be the original names or their lowerCamelCase JSON names; enums by name or
 * number; 64-bit integers as numbers or strings; maps as objects; bytes as base64.
 * Throws KataError invalid/PROTOJSON_INVALID naming the JSON path of the first problem, or
 * invalid/PROTOJSON_UNKNOWN_TYPE for a type that proto/api.proto does not define.
 */
export function decodeProtoJson<T>(typeName: string, json: unknown): T {
  const name = typeName.replace(/^\./, '');
  const type = criReflectionRoot().lookup(name);
  const definition = messageDefinition(name);
  if (!(type instanceof protobuf.Type) || definition === undefined) {
    throw invalid('PROTOJSON_UNKNOWN_TYPE', `${typeName} is not a message type of proto/api.proto.`);
  }
  const plain = convertMessage(type, json, '');
  const bytes = type.encode(type.fromObject(plain)).finish();
  return definition.deserialize(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)) as T;
}

/**
 * Parse JSON text (a file's content) and decode it like {@link decodeProtoJson}. `source` names
 * the text in the error (a file path, say). Bad JSON -> invalid/PROTOJSON_SYNTAX.
 */
export function parseProtoJson<T>(typeName: string, text: string, source = 'the JSON text'): T {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (cause) {
    throw invalid('PROTOJSON_SYNTAX', `${source} is not valid JSON.`, { cause });
  }
  return decodeProtoJson<T>(typeName, json);
}
