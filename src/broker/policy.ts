/**
 * Which attested pods may read which resource: `kata-ts/broker-policy/v1`.
 *
 *   { "schema": "kata-ts/broker-policy/v1",
 *     "resources": [ { "path": "<repository>/<type>/<tag>", "allow": ["<reference set name>", ...] } ] }
 *
 * A session that attested matched some reference sets (references.ts); it may read a resource
 * when one of those names is in that resource's `allow`. A resource the policy does not list is
 * released to nobody. Pure.
 */

import { parseResourcePath } from '../attest/resource-path.js';
import { invalid } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { REFERENCE_NAME_PATTERN } from './references.js';
import './reasons.js';

export const BROKER_POLICY_SCHEMA = 'kata-ts/broker-policy/v1';
/** Entries a policy may hold, and names per entry. */
export const POLICY_MAX_RESOURCES = 4096;
export const POLICY_MAX_ALLOW = 256;

export interface BrokerPolicyEntry {
  path: string;
  allow: string[];
}

export interface BrokerPolicy {
  schema: typeof BROKER_POLICY_SCHEMA;
  resources: BrokerPolicyEntry[];
}

const validate = compileOnce<BrokerPolicy>({
  type: 'object',
  additionalProperties: false,
  required: ['schema', 'resources'],
  properties: {
    schema: { const: BROKER_POLICY_SCHEMA },
    resources: {
      type: 'array',
      maxItems: POLICY_MAX_RESOURCES,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['path', 'allow'],
        properties: {
          path: { type: 'string' },
          allow: { type: 'array', maxItems: POLICY_MAX_ALLOW, items: { type: 'string', pattern: REFERENCE_NAME_PATTERN } },
        },
      },
    },
  },
});

/** Checks a policy document (parsed JSON); throws BROKER_POLICY_INVALID naming the field. */
export function checkPolicy(doc: unknown): BrokerPolicy {
  const v = validate();
  if (!v(doc))
    throw invalid('BROKER_POLICY_INVALID', `policy does not match ${BROKER_POLICY_SCHEMA}: ${describeSchemaErrors(v.errors).join('; ')}`);
  const seen = new Set<string>();
  doc.resources.forEach((entry, i) => {
    try {
      parseResourcePath(entry.path, `/resources/${i}/path`);
    } catch (err) {
      throw invalid('BROKER_POLICY_INVALID', `policy ${(err as Error).message}`, { cause: err });
    }
    if (seen.has(entry.path))
      throw invalid('BROKER_POLICY_INVALID', `policy /resources/${i}/path ${JSON.stringify(entry.path)} is listed twice`);
    seen.add(entry.path);
  });
  return doc;
}

/** Parses and checks a policy file's text. */
export function parsePolicyText(text: string, source: string): BrokerPolicy {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw invalid('BROKER_POLICY_INVALID', `policy ${source} is not JSON: ${(err as Error).message}`, { cause: err });
  }
  return checkPolicy(doc);
}

export type ResourceDecision = { allowed: true; by: string } | { allowed: false; reason: 'not-in-policy' | 'not-allowed'; detail: string };

/** Pure: may a session that matched `matched` read `path`? */
export function decideResource(policy: BrokerPolicy, path: string, matched: readonly string[]): ResourceDecision {
  const entry = policy.resources.find((e) => e.path === path);
  if (entry === undefined) return { allowed: false, reason: 'not-in-policy', detail: `the policy lists no resource ${path}` };
  const by = entry.allow.find((name) => matched.includes(name));
  if (by !== undefined) return { allowed: true, by };
  return {
    allowed: false,
    reason: 'not-allowed',
    detail: `${path} is allowed to [${entry.allow.join(', ')}]; this session matched [${matched.join(', ')}]`,
  };
}
