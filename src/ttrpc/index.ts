/** ttrpc, containerd's lightweight RPC protocol: framing, messages, a server and a client. */
export { connectTtrpc, type TtrpcCallOptions, TtrpcClient } from './client.js';
export { Flag, MAX_DATA_BYTES, MessageType } from './frames.js';
export type { TtrpcCall, TtrpcMethod, TtrpcService } from './handlers.js';
export type { TtrpcStatus } from './messages.js';
export { TtrpcServer, type TtrpcServerOptions } from './server.js';
export { statusOf, TtrpcStatusError } from './status.js';
