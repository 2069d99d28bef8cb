/** The host's client for the guest agent (proto/agent/agent.proto over the kata-ts channel). */
export { AgentClient, type PortForwardStream, type StdinWriter } from './client.js';
export { AGENT_PROTOCOL_VIOLATIONS_MAX, AgentConnection, type AgentConnectionOptions } from './connection.js';
