/**
 * Reason codes (`KataError.reason`) raised by the CRI gRPC server, request decoding and proto JSON.
 * A new code is added to this union; declaration merging below makes it known to the factories
 * and to `isReason` in src/common/errors.ts.
 */
export type CriReason =
  | 'PROTOJSON_INVALID'
  | 'PROTOJSON_SYNTAX'
  | 'PROTOJSON_UNKNOWN_TYPE'
  | 'REQUEST_UNDECODABLE'
  | 'RPC_UNIMPLEMENTED'
  | 'SOCKET_IN_USE'
  | 'SOCKET_PATH_OCCUPIED'
  | 'START_CONTAINER_UNIMPLEMENTED';

declare module '../common/errors.js' {
  interface KataReasons {
    cri: CriReason;
  }
}
