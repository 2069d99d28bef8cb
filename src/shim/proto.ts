/**
 * containerd's shim protocol as data: the messages of proto/containerd/ (task API v2, task
 * events, the events service, mount and task types, cgroup metrics v1/v2), loaded once with
 * protobufjs from the descriptor `npm run gen` embeds, and typed by the interfaces it generates
 * beside it (src/generated/containerd/containerd.ts).
 *
 * Every message is named by its full protobuf name, a literal the compiler checks:
 *
 *     const req = decodeMessage('containerd.task.v2.CreateTaskRequest', bytes);
 *     encodeMessage('containerd.task.v2.CreateTaskResponse', { pid: 1 });
 *
 * Decoded values follow the CRI face's loader options (src/cri/proto.ts): snake_case names,
 * 64-bit integers as decimal strings, enums by name, defaults filled in, absent messages null.
 */
import { Buffer } from 'node:buffer';
import protobuf from 'protobufjs';
import { internal, invalid } from '../common/errors.js';
import {
  CONTAINERD_DESCRIPTOR,
  CONTAINERD_SERVICES,
  type ContainerdEnums,
  type ContainerdMessageInputs,
  type ContainerdMessages,
} from '../generated/containerd/containerd.js';
import type { TtrpcCall, TtrpcService } from '../ttrpc/index.js';
import './proto-reasons.js';

/** The full name of any message of the shim protocol (`containerd.task.v2.CreateTaskRequest`). */
export type MessageName = keyof ContainerdMessages;
/** A message as {@link decodeMessage} returns it. */
export type Message<N extends MessageName> = ContainerdMessages[N];
/** A message as {@link encodeMessage} accepts it: every field optional. */
export type MessageInput<N extends MessageName> = ContainerdMessageInputs[N];
/** A task's status as State reports it. */
export type TaskStatus = ContainerdEnums['containerd.v1.types.Status'];
/** A google.protobuf.Any as decoded (a Buffer value under Node). */
export type AnyMessage = Message<'google.protobuf.Any'>;
/** A google.protobuf.Timestamp as decoded (seconds as a decimal string). */
export type Timestamp = Message<'google.protobuf.Timestamp'>;

/** The task service as containerd 1.x calls it. */
export const TASK_SERVICE_V2 = 'containerd.task.v2.Task';
/**
 * The task service as containerd 2.x calls it: the same methods with messages of the same
 * fields and numbers (checked against containerd v2.0.0's api/runtime/task/v3/shim.proto), so
 * the shim registers one method table under both names.
 */
export const TASK_SERVICE_V3 = 'containerd.task.v3.Task';
export const TASK_SERVICE_NAMES = [TASK_SERVICE_V2, TASK_SERVICE_V3] as const;
/** The task service's methods with their request and response message names. */
export const TASK_METHODS = CONTAINERD_SERVICES[TASK_SERVICE_V2];
export type TaskMethod = keyof typeof TASK_METHODS;

/** containerd's events service on its ttrpc socket (TTRPC_ADDRESS), and its one method. */
export const EVENTS_SERVICE = 'containerd.services.events.ttrpc.v1.Events';
export const EVENTS_FORWARD = 'Forward';

/** The ttrpc metadata key containerd reads a call's namespace from. */
export const NAMESPACE_METADATA_KEY = 'containerd-namespace-ttrpc';

/**
 * The type urls containerd 1.6 registers for the OCI runtime-spec types it sends as JSON in an
 * Any (runtime/typeurl.go: `types.containerd.io` + `opencontainers/runtime-spec` + spec major
 * version + type name): Exec's `spec` is a Process, Update's `resources` a LinuxResources.
 */
export const OCI_TYPE_URLS = {
  spec: 'types.containerd.io/opencontainers/runtime-spec/1/Spec',
  process: 'types.containerd.io/opencontainers/runtime-spec/1/Process',
  linuxResources: 'types.containerd.io/opencontainers/runtime-spec/1/LinuxResources',
} as const;
export type OciTypeUrl = (typeof OCI_TYPE_URLS)[keyof typeof OCI_TYPE_URLS];

/** How decoded messages are turned into plain objects (the CRI face's proto-loader options). */
const TO_OBJECT: protobuf.IConversionOptions = { longs: String, enums: String, defaults: true, oneofs: true, arrays: true, objects: true };

const root = protobuf.Root.fromJSON(CONTAINERD_DESCRIPTOR);
root.resolveAll();
const types = new Map<string, protobuf.Type>();

function typeOf(name: MessageName): protobuf.Type {
  let type = types.get(name);
  if (type === undefined) {
    type = root.lookupType(name);
    types.set(name, type);
  }
  return type;
}

/** Whether `name` is a message of the shim protocol. */
export function isMessageName(name: string): name is MessageName {
  return root.lookup(name) instanceof protobuf.Type;
}

/**
 * Encodes `value` as the message `name`, as proto3 does: scalars that hold their default value
 * (0, '', false, the enum's 0, empty bytes) are left out, so a decoded message, whose defaults
 * are filled in, encodes to the bytes it came from. Throws INTERNAL (SHIM_PROTO_ENCODE) for a
 * value protobufjs refuses.
 */
export function encodeMessage<N extends MessageName>(name: N, value: MessageInput<N>): Buffer {
  const type = typeOf(name);
  let bytes: Uint8Array;
  try {
    const message = type.fromObject(value as Record<string, unknown>);
    dropDefaults(type, message as unknown as Record<string, unknown>);
    bytes = type.encode(message).finish();
  } catch (err) {
    throw internal('SHIM_PROTO_ENCODE', `the value cannot be encoded as ${name}.`, { cause: err });
  }
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * Removes the scalar fields of `message` (a protobufjs message from fromObject) that hold their
 * default value: protobufjs writes every field that is set, defaults included, while proto3
 * (and containerd's Go code) writes none. Message fields stay even when empty: their presence
 * is meaningful (a Timestamp of 0 is 1970, an absent one "never").
 */
function dropDefaults(type: protobuf.Type, message: Record<string, unknown>): void {
  for (const field of type.fieldsArray) {
    if (!Object.hasOwn(message, field.name)) continue;
    const value = message[field.name];
    if (value === null || value === undefined) continue;
    const nested = field.resolvedType instanceof protobuf.Type ? field.resolvedType : undefined;
    if (field.map) {
      if (nested !== undefined) for (const v of Object.values(value as Record<string, Record<string, unknown>>)) dropDefaults(nested, v);
    } else if (field.repeated) {
      if (nested !== undefined) for (const v of value as Record<string, unknown>[]) dropDefaults(nested, v);
    } else if (nested !== undefined) {
      dropDefaults(nested, value as Record<string, unknown>);
    } else if (field.partOf === null && isDefaultScalar(value)) {
      delete message[field.name];
    }
  }
}

function isDefaultScalar(value: unknown): boolean {
  if (value === 0 || value === '' || value === false) return true;
  if (value instanceof Uint8Array) return value.length === 0;
  // A 64-bit integer after fromObject: a Long, or protobufjs's own {low, high} when Long is absent.
  if (typeof value === 'object' && value !== null && 'low' in value && 'high' in value) return value.low === 0 && value.high === 0;
  return false;
}

/** Decodes `bytes` as the message `name`. Throws INVALID_ARGUMENT (SHIM_PROTO_BAD_MESSAGE) for bytes that are none. */
export function decodeMessage<N extends MessageName>(name: N, bytes: Uint8Array): Message<N> {
  const type = typeOf(name);
  try {
    return type.toObject(type.decode(bytes), TO_OBJECT) as Message<N>;
  } catch (err) {
    throw invalid('SHIM_PROTO_BAD_MESSAGE', `the bytes do not hold a ${name} message.`, { cause: err });
  }
}

/**
 * Packs a message in a google.protobuf.Any as containerd expects it: the type_url is the bare
 * full name (`containerd.events.TaskExit`, `io.containerd.cgroups.v1.Metrics`), with no
 * `type.googleapis.com/` prefix, since containerd 1.6's typeurl looks types up by that name.
 */
export function anyOf<N extends MessageName>(name: N, value: MessageInput<N>): AnyMessage {
  return { type_url: name, value: encodeMessage(name, value) };
}

/**
 * The message name an Any's type_url carries: the bare name containerd sends, or the part after
 * the last `/` of a prefixed one.
 */
export function anyTypeName(any: Pick<AnyMessage, 'type_url'>): string {
  return any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
}

/**
 * Unpacks an Any that must hold the message `expected`. Throws INVALID_ARGUMENT when it holds
 * another type (SHIM_PROTO_ANY_TYPE) or bytes that are not that message (SHIM_PROTO_BAD_MESSAGE).
 */
export function decodeAny<N extends MessageName>(any: AnyMessage, expected: N): Message<N> {
  if (anyTypeName(any) !== expected) {
    throw invalid('SHIM_PROTO_ANY_TYPE', `the Any holds ${any.type_url || 'no type'}, not ${expected}.`);
  }
  return decodeMessage(expected, any.value);
}

/** Packs an OCI runtime-spec value as containerd does: JSON under its types.containerd.io url. */
export function jsonAnyOf(typeUrl: OciTypeUrl, value: unknown): AnyMessage {
  return { type_url: typeUrl, value: Buffer.from(JSON.stringify(value), 'utf8') };
}

/**
 * Unpacks a JSON-valued Any of the type url `expected` (an OCI Process in Exec, LinuxResources
 * in Update) as parsed JSON, unchecked: validating its shape is the caller's. Throws
 * INVALID_ARGUMENT for another type url (SHIM_PROTO_ANY_TYPE) or a value that is not JSON
 * (SHIM_PROTO_BAD_JSON).
 */
export function decodeJsonAny(any: AnyMessage, expected: OciTypeUrl): unknown {
  if (any.type_url !== expected) {
    throw invalid('SHIM_PROTO_ANY_TYPE', `the Any holds ${any.type_url || 'no type'}, not ${expected}.`);
  }
  try {
    return JSON.parse(Buffer.from(any.value.buffer, any.value.byteOffset, any.value.byteLength).toString('utf8')) as unknown;
  } catch (err) {
    throw invalid('SHIM_PROTO_BAD_JSON', `the ${expected} value is not JSON.`, { cause: err });
  }
}

const NS_PER_S = 1_000_000_000n;

/**
 * A time in nanoseconds since the epoch (the core's unit, src/common/time.ts) as a Timestamp.
 * For "not exited yet" send no timestamp (null), not this of 0: containerd's Go code reads an
 * absent timestamp as its zero time, but {0, 0} as 1970.
 */
export function timestampOfNs(ns: bigint): Timestamp {
  let seconds = ns / NS_PER_S;
  let nanos = ns % NS_PER_S;
  if (nanos < 0n) {
    seconds -= 1n;
    nanos += NS_PER_S;
  }
  return { seconds: seconds.toString(), nanos: Number(nanos) };
}

/** A Timestamp as nanoseconds since the epoch; undefined for an absent one. */
export function nsOfTimestamp(ts: Timestamp | null | undefined): bigint | undefined {
  if (ts === null || ts === undefined) return undefined;
  return BigInt(ts.seconds) * NS_PER_S + BigInt(ts.nanos);
}

type ServiceName = keyof typeof CONTAINERD_SERVICES;
type MethodsOf<S extends ServiceName> = (typeof CONTAINERD_SERVICES)[S];

/**
 * Typed handlers for every method of the service `S`: the decoded request in, the response
 * message (as encoding accepts it) out.
 */
export type ServiceHandlers<S extends ServiceName> = {
  [M in keyof MethodsOf<S>]: MethodsOf<S>[M] extends { request: infer Q extends MessageName; response: infer R extends MessageName }
    ? (request: Message<Q>, call: TtrpcCall) => Promise<MessageInput<R>> | MessageInput<R>
    : never;
};
/** Handlers for the whole task API. */
export type TaskHandlers = ServiceHandlers<typeof TASK_SERVICE_V2>;

/**
 * The ttrpc method table of the service `service` over typed handlers: each method decodes its
 * request (bad bytes answer INVALID_ARGUMENT) and encodes its handler's answer. For the task
 * API, register the one table under both {@link TASK_SERVICE_NAMES}.
 */
export function serviceMethods<S extends ServiceName>(service: S, handlers: ServiceHandlers<S>): TtrpcService {
  const methods: Record<string, (request: Buffer, call: TtrpcCall) => Promise<Uint8Array>> = {};
  const table = CONTAINERD_SERVICES[service] as Record<string, { request: MessageName; response: MessageName }>;
  const typed = handlers as unknown as Record<string, (request: unknown, call: TtrpcCall) => Promise<unknown> | unknown>;
  for (const [method, { request, response }] of Object.entries(table)) {
    const handler = typed[method];
    // The type demands every handler; one missing anyway (plain JavaScript) answers UNIMPLEMENTED.
    if (handler === undefined) continue;
    methods[method] = async (bytes, call) => {
      const answer = await handler(decodeMessage(request, bytes), call);
      return encodeMessage(response, answer as MessageInput<typeof response>);
    };
  }
  return methods;
}
