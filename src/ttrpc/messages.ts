/**
 * ttrpc's two envelope messages, Request and Response (carrying a google.rpc.Status), as
 * protobuf. They are four small messages with fixed field numbers, so they are declared here
 * with protobufjs reflection rather than generated: no .proto file is read at run time, and the
 * unit tests pin every field number against hand-built bytes.
 *
 *     Request  { string service = 1; string method = 2; bytes payload = 3;
 *                int64 timeout_nano = 4; repeated KeyValue metadata = 5; }
 *     KeyValue { string key = 1; string value = 2; }
 *     Response { google.rpc.Status status = 1; bytes payload = 2; }
 *     Status   { int32 code = 1; string message = 2; repeated google.protobuf.Any details = 3; }
 */
import { Buffer } from 'node:buffer';
import protobuf from 'protobufjs';
import { invalid } from '../common/errors.js';
import './reasons.js';

export interface TtrpcMetadataEntry {
  key: string;
  value: string;
}

export interface TtrpcRequest {
  /** Full service name, `containerd.task.v2.Task`. */
  service: string;
  method: string;
  /** The call's own request message, already encoded. */
  payload: Buffer;
  /** The caller's remaining time in nanoseconds; 0 means no deadline. */
  timeoutNs: number;
  metadata: TtrpcMetadataEntry[];
}

export interface TtrpcStatus {
  /** A google.rpc.Code number (src/common/status-codes.ts). */
  code: number;
  message: string;
}

export interface TtrpcResponse {
  status: TtrpcStatus;
  payload: Buffer;
}

const root = protobuf.Root.fromJSON({
  nested: {
    ttrpc: {
      nested: {
        KeyValue: { fields: { key: { type: 'string', id: 1 }, value: { type: 'string', id: 2 } } },
        Request: {
          fields: {
            service: { type: 'string', id: 1 },
            method: { type: 'string', id: 2 },
            payload: { type: 'bytes', id: 3 },
            timeout_nano: { type: 'int64', id: 4 },
            metadata: { rule: 'repeated', type: 'KeyValue', id: 5 },
          },
        },
        Response: { fields: { status: { type: 'google.rpc.Status', id: 1 }, payload: { type: 'bytes', id: 2 } } },
      },
    },
    google: {
      nested: {
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
          },
        },
        protobuf: { nested: { Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } } } },
      },
    },
  },
});
const RequestType = root.lookupType('ttrpc.Request');
const ResponseType = root.lookupType('ttrpc.Response');

// Bytes fields decode to Buffers under Node (protobufjs's default there); asBuffer() makes sure.
const TO_OBJECT: protobuf.IConversionOptions = { longs: Number, defaults: true, arrays: true };

function finish(type: protobuf.Type, value: Record<string, unknown>): Buffer {
  const bytes = type.encode(type.fromObject(value)).finish();
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function asBuffer(value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  return Buffer.alloc(0);
}

export function encodeRequest(request: TtrpcRequest): Buffer {
  return finish(RequestType, {
    service: request.service,
    method: request.method,
    payload: request.payload,
    timeout_nano: request.timeoutNs,
    metadata: request.metadata,
  });
}

/** Throws INVALID_ARGUMENT (TTRPC_BAD_REQUEST) for bytes that are no Request. */
export function decodeRequest(bytes: Uint8Array): TtrpcRequest {
  let o: Record<string, unknown>;
  try {
    o = RequestType.toObject(RequestType.decode(bytes), TO_OBJECT);
  } catch (err) {
    throw invalid('TTRPC_BAD_REQUEST', 'the request frame does not hold a ttrpc Request message.', { cause: err });
  }
  return {
    service: o.service as string,
    method: o.method as string,
    payload: asBuffer(o.payload),
    timeoutNs: o.timeout_nano as number,
    metadata: (o.metadata as { key: string; value: string }[]).map(({ key, value }) => ({ key, value })),
  };
}

export function encodeResponse(response: TtrpcResponse): Buffer {
  return finish(ResponseType, { status: { code: response.status.code, message: response.status.message }, payload: response.payload });
}

/**
 * Throws INVALID_ARGUMENT (TTRPC_BAD_RESPONSE) for bytes that are no Response. A Response
 * without a status is a success, as containerd's client reads it.
 */
export function decodeResponse(bytes: Uint8Array): TtrpcResponse {
  let o: Record<string, unknown>;
  try {
    o = ResponseType.toObject(ResponseType.decode(bytes), TO_OBJECT);
  } catch (err) {
    throw invalid('TTRPC_BAD_RESPONSE', 'the response frame does not hold a ttrpc Response message.', { cause: err });
  }
  const status = o.status as { code: number; message: string } | null | undefined;
  return { status: { code: status?.code ?? 0, message: status?.message ?? '' }, payload: asBuffer(o.payload) };
}
