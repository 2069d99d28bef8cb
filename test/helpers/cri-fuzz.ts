/**
 * Generators for fuzzing the CRI surface over its socket: random messages of any request type
 * built from the proto's own reflection (every field, nasty values: huge and control-character
 * strings, traversal, negative and absurd numbers, unknown enum values, big maps), mutations of
 * encoded requests (bit flips, truncation, wrong wire types), and raw bytes.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { Client, credentials, Metadata, type ServiceError } from '@grpc/grpc-js';
import fc from 'fast-check';
import type protobuf from 'protobufjs';
import { criReflectionRoot } from '../../src/cri/proto.js';

/** Every file and directory under `dir`, relative, a file with a hash of its contents, sorted. */
export async function hashedFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  async function walk(d: string): Promise<void> {
    for (const e of await fsp.readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) {
        out.push(`${path.relative(dir, p)}/`);
        await walk(p);
      } else {
        const body = await fsp.readFile(p).catch(() => Buffer.alloc(0));
        out.push(`${path.relative(dir, p)} ${createHash('sha256').update(body).digest('hex').slice(0, 12)}`);
      }
    }
  }
  await walk(dir);
  return out.sort();
}

/** One unary rpc of the CRI: its gRPC path and request type. */
export interface FuzzRpc {
  service: 'RuntimeService' | 'ImageService';
  name: string;
  path: string;
  requestType: protobuf.Type;
}

/** Every unary rpc of both CRI services (`streaming`: the server-streaming ones instead). */
export function unaryRpcs(streaming = false): FuzzRpc[] {
  const root = criReflectionRoot();
  const out: FuzzRpc[] = [];
  for (const service of ['RuntimeService', 'ImageService'] as const) {
    const svc = root.lookupService(`runtime.v1.${service}`);
    for (const method of Object.values(svc.methods)) {
      if (method.requestStream === true) continue;
      if ((method.responseStream === true) !== streaming) continue;
      out.push({
        service,
        name: method.name,
        path: `/runtime.v1.${service}/${method.name}`,
        requestType: root.lookupType(method.requestType),
      });
    }
  }
  return out;
}

const NASTY_STRINGS = [
  '',
  '.',
  '..',
  '/',
  '../../../../etc/passwd',
  '/etc/shadow',
  '..%2f..%2fetc',
  'a/../../b',
  '/proc/self/root',
  '$(touch /tmp/kata-ts-fuzz-pwned)',
  '`id`',
  '; rm -rf /',
  '-rf',
  '--help',
  'a\u0000b',
  '\n\r\t',
  '\u001b[31m',
  'é日本語🚀',
  '\u202e\u200b',
  'x'.repeat(5000),
  '/kubepods/../../..',
  'kubepods.slice',
  '-5',
  '1Gi',
  'null',
  '{}',
];

/**
 * Names a kubelet never sends, each refused by the names validator (src/runtime/spec/names.ts)
 * wherever a name goes (pod and container name, namespace, uid, hostname, label and annotation
 * key): NUL and other control characters (C0, DEL, C1), and lengths past every bound (the issue's
 * 300 KB pod name).
 */
const HOSTILE_NAMES = [
  'web\u0000',
  '\u0000',
  'a\u0007b',
  'a\u007fb',
  'a\u0085b',
  'tab\there',
  'line\nbreak',
  'n'.repeat(254),
  'n'.repeat(300 * 1024),
  `${'p'.repeat(254)}/app`,
];

/** Keys that are printable and short, yet not Kubernetes qualified names (refused as label and annotation keys). */
const HOSTILE_KEYS = ['a/b/c', '/app', 'app/', 'app.', '-app', 'a b', '../../etc/passwd', `example.com/${'k'.repeat(64)}`];

/** A hostile name: one of the list above, or a valid-looking name with a control character inside. */
export const hostileName: fc.Arbitrary<string> = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom(...HOSTILE_NAMES) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(
        fc.stringMatching(/^[a-z0-9]{1,10}$/),
        fc.integer({ min: 0, max: 0x9f }).filter((c) => c < 0x20 || c >= 0x7f),
      )
      .map(([s, c]) => `${s}${String.fromCharCode(c)}${s}`),
  },
);

/** A hostile label or annotation key: a hostile name, or a printable key that is not a qualified name. */
export const hostileKey: fc.Arbitrary<string> = fc.oneof(hostileName, fc.constantFrom(...HOSTILE_KEYS));

/** Annotations whose keys and values take more than `limitBytes`: in one value, or spread over many keys. */
export function annotationsOver(limitBytes: number): fc.Arbitrary<Record<string, string>> {
  const key = 'example.com/big';
  return fc.oneof(
    fc.integer({ min: 1, max: 64 * 1024 }).map((extra) => ({ [key]: 'x'.repeat(limitBytes - key.length + extra) })),
    fc.constant(
      Object.fromEntries(Array.from({ length: Math.ceil(limitBytes / 1024) + 1 }, (_, i) => [`example.com/k${i}`, 'v'.repeat(1024)])),
    ),
  );
}

/** Strings: a nasty one, random unicode, or (rarely) a very long one. */
export const nastyString: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...NASTY_STRINGS) },
  { weight: 3, arbitrary: fc.string({ unit: 'binary', maxLength: 40 }) },
  { weight: 2, arbitrary: fc.stringMatching(/^[a-z0-9][a-z0-9.-]{0,20}$/) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 200_000 }).map((n) => 'z'.repeat(n)) },
);

const int64Like = fc.oneof(
  fc.constantFrom('0', '-1', '-5', '1', '9223372036854775807', '-9223372036854775808', '4294967296'),
  fc.bigInt({ min: -(1n << 63n), max: (1n << 63n) - 1n }).map(String),
);
const int32Like = fc.oneof(fc.constantFrom(0, -1, 2147483647, -2147483648), fc.integer());

/** Image references go nowhere but loopback: a reference that parses is pulled from a closed port. */
const imageRef = fc.oneof(
  nastyString.map((s) => `127.0.0.1:1/${s}`),
  nastyString.map((s) => ` ${s}`),
  fc.constantFrom('127.0.0.1:1/busybox:latest', '127.0.0.1:1/a@sha256:00', 'UPPER/Case', ''),
);

function scalar(field: protobuf.Field): fc.Arbitrary<unknown> {
  const enumType = field.resolvedType as protobuf.Enum | null;
  if (enumType !== null && 'values' in enumType) {
    return fc.oneof(fc.constantFrom(...Object.values(enumType.values)), fc.integer({ min: -3, max: 1000 }));
  }
  switch (field.type) {
    case 'string':
      return nastyString;
    case 'bytes':
      return fc.uint8Array({ maxLength: 64 });
    case 'bool':
      return fc.boolean();
    case 'int64':
    case 'sint64':
    case 'sfixed64':
      return int64Like;
    case 'uint64':
    case 'fixed64':
      return fc.oneof(fc.constantFrom('0', '18446744073709551615'), fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }).map(String));
    case 'uint32':
    case 'fixed32':
      return fc.integer({ min: 0, max: 0xffffffff });
    case 'double':
    case 'float':
      return fc.double();
    default:
      return int32Like;
  }
}

const cache = new Map<string, fc.Arbitrary<Record<string, unknown>>>();

/** A random message of `type` (every field optional), nested up to `depth` levels. */
export function arbMessage(type: protobuf.Type, depth = 4): fc.Arbitrary<Record<string, unknown>> {
  const key = `${type.fullName}/${depth}`;
  const hit = cache.get(key);
  if (hit !== undefined) return hit;
  const fields: Record<string, fc.Arbitrary<unknown>> = {};
  for (const field of type.fieldsArray) {
    field.resolve();
    const nested = field.resolvedType;
    let value: fc.Arbitrary<unknown>;
    if (type.fullName === '.runtime.v1.ImageSpec' && field.name === 'image') value = imageRef;
    else if (nested !== null && 'fieldsArray' in nested) {
      if (depth <= 0) continue;
      value = arbMessage(nested as protobuf.Type, depth - 1);
    } else value = scalar(field);
    if (field.map) {
      value = fc.oneof(
        {
          weight: 5,
          arbitrary: fc.dictionary(
            nastyString.filter((s) => s.length < 300),
            value,
            { maxKeys: 4 },
          ),
        },
        {
          weight: 1,
          arbitrary: fc
            .integer({ min: 100, max: 3000 })
            .map((n) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, `v${i}`]))),
        },
      );
    } else if (field.repeated) {
      value = fc.array(value, { maxLength: depth > 2 ? 4 : 2 });
    }
    fields[field.name] = value;
  }
  const arb = fc.record(fields, { requiredKeys: [] });
  cache.set(key, arb);
  return arb;
}

/** Encode a random object as `type`; values protobufjs cannot take are dropped field by field. */
export function encodeLoosely(type: protobuf.Type, value: Record<string, unknown>): Buffer {
  try {
    return Buffer.from(type.encode(type.fromObject(value)).finish());
  } catch {
    const kept: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      try {
        type.encode(type.fromObject({ [k]: v })).finish();
        kept[k] = v;
      } catch {
        // dropped: protobufjs refuses it client-side
      }
    }
    return Buffer.from(type.encode(type.fromObject(kept)).finish());
  }
}

/** Byte-level mutations of an encoded request: flips, truncation, insertion, a wrong wire type. */
export const mutation: fc.Arbitrary<(bytes: Buffer) => Buffer> = fc.oneof(
  fc.nat().map((i) => (b: Buffer) => (b.length === 0 ? b : Buffer.concat([b.subarray(0, i % b.length)]))),
  fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })).map(([i, x]) => (b: Buffer) => {
    const c = Buffer.from(b);
    if (c.length > 0) c[i % c.length]! ^= x;
    return c;
  }),
  fc.tuple(fc.nat(), fc.uint8Array({ minLength: 1, maxLength: 16 })).map(([i, extra]) => (b: Buffer) => {
    const at = b.length === 0 ? 0 : i % b.length;
    return Buffer.concat([b.subarray(0, at), Buffer.from(extra), b.subarray(at)]);
  }),
  // Field 1 sent with every wire type (varint, fixed64, length-delimited, group, fixed32).
  fc
    .constantFrom(0x08, 0x09, 0x0a, 0x0b, 0x0d)
    .map((tag) => (b: Buffer) => Buffer.concat([Buffer.from([tag, 0x05, 1, 2, 3, 4, 5, 6, 7, 8]), b])),
);

/** The outcome of one raw call: a gRPC status code and reason (0 = OK), or `noAnswer` by the deadline. */
export interface RawOutcome {
  code: number;
  reason: string | undefined;
  details: string;
}

/** A client that sends already-encoded request bodies and ignores the response's contents. */
export function rawClient(socketPath: string): Client {
  return new Client(`unix://${socketPath}`, credentials.createInsecure(), { 'grpc.max_send_message_length': 64 * 1024 * 1024 });
}

/** Send `body` to `path` and resolve with the status (never rejects). */
export function rawCall(client: Client, path: string, body: Buffer, deadlineMs: number): Promise<RawOutcome> {
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      path,
      (b: Buffer) => b,
      (b: Buffer) => b,
      body,
      new Metadata(),
      { deadline: Date.now() + deadlineMs },
      (err: ServiceError | null) => {
        if (err === null) resolve({ code: 0, reason: undefined, details: '' });
        else resolve({ code: err.code, reason: err.metadata?.get('kata-ts-reason')?.[0]?.toString(), details: err.details });
      },
    );
  });
}

/** Open a server stream with `body`; resolve with its final status (never rejects). */
export function rawStream(client: Client, path: string, body: Buffer, deadlineMs: number): Promise<RawOutcome> {
  return new Promise((resolve) => {
    const call = client.makeServerStreamRequest(
      path,
      (b: Buffer) => b,
      (b: Buffer) => b,
      body,
      new Metadata(),
      { deadline: Date.now() + deadlineMs },
    );
    call.on('data', () => undefined);
    call.on('error', (err: ServiceError) =>
      resolve({ code: err.code, reason: err.metadata?.get('kata-ts-reason')?.[0]?.toString(), details: err.details }),
    );
    call.on('end', () => resolve({ code: 0, reason: undefined, details: '' }));
  });
}
