/** The kata-ts channel: many flow-controlled streams over one byte link, and typed RPC on them. */
export { type MessageCodec, protobufCodec } from './codec.js';
export {
  type ChannelLimits,
  ChannelServer,
  type ConnectOptions,
  connectSession,
  DEFAULT_LIMITS,
  duplexLink,
  HELLO_FLOOD_MAX_BYTES,
  serveDuplex,
} from './endpoint.js';
export { MAGIC, MAX_FRAME_PAYLOAD_BYTES, PROTOCOL_VERSION } from './frames.js';
export { type CallWriter, RpcClient } from './rpc-client.js';
export { serveRpc } from './rpc-server.js';
export type {
  CallContext,
  CallOptions,
  Init,
  MethodsOfKind,
  MethodTable,
  ServerHandler,
  ServerHandlers,
  StreamCallOptions,
} from './rpc-types.js';
export { type Link, Session } from './session.js';
export { ChannelStream } from './stream.js';
