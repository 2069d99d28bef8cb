/**
 * Reason codes (`KataError.reason`) of the shim's protocol layer: containerd's messages
 * (src/shim/proto.ts) and the event publisher (src/shim/events.ts).
 */
export type ShimProtoReason =
  /** Bytes that do not decode as the message the method expects. */
  | 'SHIM_PROTO_BAD_MESSAGE'
  /** A value that protobufjs cannot encode as the named message (a bug on our side). */
  | 'SHIM_PROTO_ENCODE'
  /** A google.protobuf.Any of another type than the one expected. */
  | 'SHIM_PROTO_ANY_TYPE'
  /** A JSON-valued Any (an OCI process or resources) whose value is not JSON. */
  | 'SHIM_PROTO_BAD_JSON'
  /** The event publisher was closed while it was connecting to containerd. */
  | 'SHIM_EVENTS_CLOSED';

declare module '../common/errors.js' {
  interface KataReasons {
    shimProto: ShimProtoReason;
  }
}
