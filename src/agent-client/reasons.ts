/**
 * Reason codes (`KataError.reason`) raised by the host's client of the guest agent (connection, version check, keepalive). A new code is added to this union;
 * declaration merging below makes it known to the factories and to `isReason` in
 * src/common/errors.ts.
 */
export type AgentClientReason =
  | 'AGENT_API_FEATURE_MISSING'
  | 'AGENT_API_MISMATCH'
  | 'AGENT_CALL_CANCELLED'
  | 'AGENT_CLIENT_CLOSED'
  | 'AGENT_HELLO_FAILED'
  | 'AGENT_KEEPALIVE_FAILED'
  | 'AGENT_NOT_CONNECTED'
  | 'AGENT_PROTOCOL_VIOLATION'
  | 'AGENT_SESSION_ENDED';

declare module '../common/errors.js' {
  interface KataReasons {
    agentClient: AgentClientReason;
  }
}
