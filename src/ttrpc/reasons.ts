/**
 * Reason codes (`KataError.reason`) raised by the ttrpc library, on either side. A new code is
 * added to this union; declaration merging below makes it known to the factories and to
 * `isReason` in src/common/errors.ts.
 */
export type TtrpcReason =
  | 'TTRPC_BAD_REQUEST'
  | 'TTRPC_BAD_RESPONSE'
  | 'TTRPC_CALL_CANCELLED'
  | 'TTRPC_CALL_TIMEOUT'
  | 'TTRPC_CLIENT_CLOSED'
  | 'TTRPC_CONNECTION_LOST'
  | 'TTRPC_CONNECT_TIMEOUT'
  | 'TTRPC_DEADLINE'
  | 'TTRPC_MESSAGE_TOO_LARGE'
  | 'TTRPC_PROTOCOL'
  | 'TTRPC_SERVICE_EXISTS'
  | 'TTRPC_SERVICE_NAME'
  | 'TTRPC_SOCKET_IN_USE'
  | 'TTRPC_STATUS'
  | 'TTRPC_STREAM_IDS_EXHAUSTED';

declare module '../common/errors.js' {
  interface KataReasons {
    ttrpc: TtrpcReason;
  }
}
