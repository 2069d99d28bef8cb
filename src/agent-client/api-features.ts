/**
 * Which agent API versions this host talks to, and what each older one lacks.
 *
 * A host speaks AGENT_API_VERSION (the `api_version:` line of proto/agent/agent.proto) and also
 * the version before it, so that an upgraded daemon keeps serving the pods whose VMs run the
 * previous release's agent (no drain on upgrade). An agent of the previous version decodes a
 * request with the protobuf schema it was built with: a field added since is dropped without a
 * word and an rpc added since is unknown to it. So whatever was added since the previous version
 * is listed below, and the client refuses a call that uses it before sending it, naming the
 * feature and the agent's version, instead of letting the agent act without it.
 *
 * The table is kept by hand beside the proto's `// since API N` lines; test/unit/agent-client/
 * api-features.test.ts checks that the two list the same things and, with git history at hand,
 * that everything the proto gained since API_BASELINES' commit carries such a line.
 */
import { precondition, unavailable } from '../common/errors.js';
import { AGENT_API_VERSION, type AgentMethods } from '../generated/agent/agent.js';

/** The oldest agent API this host talks to: one version back (N-1). */
export const AGENT_API_MIN_VERSION = AGENT_API_VERSION - 1;

/** Something the agent API gained in version `since`: an rpc, or one field of an rpc's request. */
export interface AgentApiFeature {
  /** What the error names ("secrets"). */
  readonly feature: string;
  readonly since: number;
  readonly method: keyof AgentMethods;
  /** The request field (camelCase, as the generated types name it); absent: the whole rpc. */
  readonly field?: string;
}

/** Everything added since AGENT_API_MIN_VERSION (one entry per `// since API N` line of agent.proto). */
export const AGENT_API_FEATURES: readonly AgentApiFeature[] = [
  { feature: 'secrets', since: 3, method: 'CreateContainer', field: 'secrets' },
  { feature: 'reseed after a template restore', since: 3, method: 'ReseedGuest' },
  { feature: 'a pod without a shared directory', since: 3, method: 'CreatePod', field: 'withoutSharedDir' },
];

/**
 * For each older API the host supports, the last commit whose agent.proto was that version (the
 * proto there is what an agent of that version knows): the unit test diffs the proto against it,
 * the integration test builds that commit's agent. API 2's is the commit before
 * CreateContainerRequest.secrets was added (e02d7bc added it without bumping the version; this
 * table's API 3 starts there).
 */
export const API_BASELINES: Readonly<Record<number, string>> = { 2: 'ce7c2e82e63d5d0e0e1c63d650bcd2f80113fe61' };

/**
 * The API version a session runs at, from the agent's Hello answer: the agent's own when this
 * host speaks it (current or one back); anything else is AGENT_API_MISMATCH naming both.
 */
export function negotiateApiVersion(agentApiVersion: number, hostApiVersion = AGENT_API_VERSION): number {
  const oldest = hostApiVersion - 1;
  if (Number.isInteger(agentApiVersion) && agentApiVersion >= oldest && agentApiVersion <= hostApiVersion) return agentApiVersion;
  throw unavailable(
    'AGENT_API_MISMATCH',
    `the agent speaks API ${agentApiVersion}; this daemon speaks API ${hostApiVersion} and also ${oldest}, no other (an agent ${
      agentApiVersion > hostApiVersion
        ? 'newer than the daemon needs a daemon at least as new'
        : 'that old needs its pod recreated or the node drained'
    }).`,
    { details: { agentApiVersion, hostApiVersion, oldestApiVersion: oldest } },
  );
}

/** The features an agent of `apiVersion` lacks (empty for the current version). */
export function missingFeatures(apiVersion: number, table: readonly AgentApiFeature[] = AGENT_API_FEATURES): AgentApiFeature[] {
  return table.filter((f) => f.since > apiVersion);
}

/** Whether a decoded-style request value is set, as protobuf would put it on the wire (not a default). */
function isSet(value: unknown): boolean {
  if (value === undefined || value === null) return false;
  if (Array.isArray(value) || value instanceof Uint8Array) return value.length > 0;
  if (typeof value === 'string') return value !== '';
  if (typeof value === 'number') return value !== 0;
  if (typeof value === 'boolean') return value;
  return true;
}

/**
 * Refuses (FAILED_PRECONDITION, AGENT_API_FEATURE_MISSING) a call to an agent of `apiVersion`
 * that uses what that version lacks: an rpc added since, or a request field added since that the
 * request sets. Nothing is sent; the message names the feature, the agent's version and the way out.
 */
export function checkApiFeatures(
  apiVersion: number,
  method: keyof AgentMethods,
  request: unknown,
  table: readonly AgentApiFeature[] = AGENT_API_FEATURES,
): void {
  for (const f of table) {
    if (f.method !== method || f.since <= apiVersion) continue;
    if (f.field !== undefined && !isSet((request as Record<string, unknown> | null | undefined)?.[f.field])) continue;
    const what = f.field === undefined ? `the rpc ${method}` : `${method}'s field ${f.field}`;
    throw precondition(
      'AGENT_API_FEATURE_MISSING',
      `the pod's agent speaks API ${apiVersion}, which has no ${f.feature} (${what}, added in API ${f.since}); recreate the pod to run the current agent.`,
      {
        details: {
          feature: f.feature,
          method,
          ...(f.field === undefined ? {} : { field: f.field }),
          agentApiVersion: apiVersion,
          since: f.since,
        },
      },
    );
  }
}
