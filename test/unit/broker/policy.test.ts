import { describe, expect, it } from 'vitest';
import { BROKER_POLICY_SCHEMA, checkPolicy, decideResource, parsePolicyText } from '../../../src/broker/policy.js';
import { isReason } from '../../../src/common/errors.js';

const policy = (resources: unknown) => ({ schema: BROKER_POLICY_SCHEMA, resources });

function refused(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(isReason(err, 'BROKER_POLICY_INVALID')).toBe(true);
    return (err as Error).message;
  }
  throw new Error('expected a refusal');
}

describe('broker policy', () => {
  it('accepts the documented shape', () => {
    expect(checkPolicy(policy([{ path: 'lab/key/web', allow: ['web', 'web-2'] }])).resources).toHaveLength(1);
    expect(checkPolicy(policy([])).resources).toEqual([]);
  });

  it.each([
    [{ resources: [] }, "must have required property 'schema'"],
    [{ schema: 'kata-ts/broker-policy/v2', resources: [] }, '/schema must be equal to constant'],
    [policy({}), '/resources must be array'],
    [policy([{ path: 'a/b/c' }]), "/resources/0 must have required property 'allow'"],
    [policy([{ path: 'a/b/c', allow: 'web' }]), '/resources/0/allow must be array'],
    [policy([{ path: 'a/b/c', allow: ['../x'] }]), '/resources/0/allow/0 must match pattern'],
    [policy([{ path: 'a/b/c', allow: [], deny: [] }]), '/resources/0/deny is not a known key'],
    [policy([{ path: 'a/b', allow: [] }]), '/resources/0/path "a/b" must be <repository>/<type>/<tag>'],
    [policy([{ path: 'a/../c', allow: [] }]), `/resources/0/path's type ".."`],
    [
      policy([
        { path: 'a/b/c', allow: [] },
        { path: 'a/b/c', allow: ['x'] },
      ]),
      '/resources/1/path "a/b/c" is listed twice',
    ],
  ])('refuses %j naming the field', (doc, message) => {
    expect(refused(() => checkPolicy(doc))).toContain(message);
  });

  it('refuses text that is not JSON, naming the file', () => {
    expect(refused(() => parsePolicyText('{', '/x/policy.json'))).toMatch(/^policy \/x\/policy\.json is not JSON/);
  });

  it('decides: allowed by the first matched name in allow; unlisted or not allowed is refused with why', () => {
    const p = checkPolicy(policy([{ path: 'lab/key/web', allow: ['a', 'b'] }]));
    expect(decideResource(p, 'lab/key/web', ['b', 'c'])).toEqual({ allowed: true, by: 'b' });
    expect(decideResource(p, 'lab/key/web', ['c'])).toEqual({
      allowed: false,
      reason: 'not-allowed',
      detail: 'lab/key/web is allowed to [a, b]; this session matched [c]',
    });
    expect(decideResource(p, 'lab/key/db', ['a'])).toMatchObject({ allowed: false, reason: 'not-in-policy' });
    expect(decideResource(p, 'lab/key/web', [])).toMatchObject({ allowed: false });
  });
});
