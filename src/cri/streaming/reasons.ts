/**
 * Reason codes of the streaming server (Exec, Attach, PortForward and the SPDY/WebSocket
 * protocols behind them). Merged into `KataReasons` so the factories accept them.
 */
export type StreamingReason =
  | 'STREAM_CONTAINER_ID_MISSING'
  | 'STREAM_SANDBOX_ID_MISSING'
  | 'STREAM_NO_STDIO'
  | 'STREAM_TTY_WITH_STDERR'
  | 'STREAM_CMD_EMPTY'
  | 'STREAM_PORT_INVALID'
  | 'STREAM_TOKENS_EXHAUSTED'
  | 'STREAM_SERVER_ADDRESS_INVALID'
  | 'STREAM_TLS_FILES'
  | 'SPDY_FRAME_TOO_LARGE'
  | 'SPDY_PROTOCOL_ERROR'
  // Raised by the agent's output journal (guest/agent/reasons.ts, outside the host build): an
  // attach reader fell behind the log pump's acknowledgements; attach goes on from the live end.
  | 'OUTPUT_OFFSET_GONE';

declare module '../../common/errors.js' {
  interface KataReasons {
    streaming: StreamingReason;
  }
}
