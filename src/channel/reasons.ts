/**
 * Reason codes (`KataError.reason`) raised by the channel (framing, sessions, streams, credits) and its RPC layer, on either side. A new code is added to this union;
 * declaration merging below makes it known to the factories and to `isReason` in
 * src/common/errors.ts.
 */
export type ChannelReason =
  | 'AGENT_ERROR'
  | 'AGENT_INTERNAL'
  | 'AGENT_UNKNOWN_METHOD'
  | 'CHANNEL_BAD_RECORD'
  | 'CHANNEL_CALL_CANCELLED'
  | 'CHANNEL_CALL_CLOSED'
  | 'CHANNEL_CALL_TIMEOUT'
  | 'CHANNEL_CONNECT_ABORTED'
  | 'CHANNEL_CONTROL_FLOOD'
  | 'CHANNEL_DESYNC'
  | 'CHANNEL_FLOW_CONTROL'
  | 'CHANNEL_HELLO_FLOOD'
  | 'CHANNEL_HELLO_TIMEOUT'
  | 'CHANNEL_LINK_CLOSED'
  | 'CHANNEL_LINK_LOST'
  | 'CHANNEL_MESSAGE_TOO_LARGE'
  | 'CHANNEL_MISSING_REQUEST'
  | 'CHANNEL_MISSING_RESPONSE'
  | 'CHANNEL_PEER_RESTARTED'
  | 'CHANNEL_PING_TIMEOUT'
  | 'CHANNEL_SESSION_CLOSED'
  | 'CHANNEL_SESSION_REPLACED'
  | 'CHANNEL_STREAM_CANCELLED'
  | 'CHANNEL_STREAM_CLOSED'
  | 'CHANNEL_STREAM_REFUSED'
  | 'CHANNEL_STREAM_RESET'
  | 'CHANNEL_STREAM_TIMEOUT'
  | 'CHANNEL_TRUNCATED_MESSAGE'
  | 'CHANNEL_VERSION_MISMATCH';

declare module '../common/errors.js' {
  interface KataReasons {
    channel: ChannelReason;
  }
}
