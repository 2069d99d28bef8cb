/** The host's client for the guest agent (proto/agent/agent.proto over the kata-ts channel). */

export {
  AGENT_API_FEATURES,
  AGENT_API_MIN_VERSION,
  type AgentApiFeature,
  API_BASELINES,
  checkApiFeatures,
  missingFeatures,
  negotiateApiVersion,
} from './api-features.js';
export { AgentClient, type PortForwardStream, type StdinWriter } from './client.js';
export { AGENT_KEEPALIVE_DEFAULTS, AGENT_PROTOCOL_VIOLATIONS_MAX, AgentConnection, type AgentConnectionOptions } from './connection.js';
export { type AgentUnaryMethod, REPEATABLE_SIGNALS, retryableAfterSessionEnd } from './idempotence.js';
