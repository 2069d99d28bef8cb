import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { decodeBundleRole, decodePodSpec, decodeTaskContainerSpec } from '../../../../src/shim/decode/index.js';
import { configFixtures, loadConfig } from './fixtures.js';

const fixtures = configFixtures();
const render = (value: unknown): string => `${JSON.stringify(value, null, 2)}\n`;

/** What the decoder makes of a fixture: the pod's spec and facts, or the container's spec. */
function decode(name: string): unknown {
  const oci = loadConfig(name);
  const role = decodeBundleRole(oci);
  if (role.role === 'sandbox') return { role, pod: decodePodSpec(oci) };
  return { role, container: decodeTaskContainerSpec(oci, role.sandboxId) };
}

describe('config.json goldens (fixtures/containerd, fixtures/cri-o; UPDATE_GOLDENS=1 rewrites the synthetic ones)', () => {
  it('has synthetic fixtures of both managers, sandboxes and containers', () => {
    const names = fixtures.filter((f) => f.synthetic).map((f) => f.name);
    expect(names.filter((n) => n.startsWith('containerd/') && n.includes('sandbox')).length).toBeGreaterThanOrEqual(2);
    expect(names.filter((n) => n.startsWith('containerd/') && n.includes('container')).length).toBeGreaterThanOrEqual(3);
    expect(names.filter((n) => n.startsWith('cri-o/')).length).toBeGreaterThanOrEqual(2);
  });

  it.each(fixtures.map((f) => [f.name, f] as const))('%s', (_name, fixture) => {
    const actual = render(decode(fixture.name));
    if (fixture.synthetic && process.env.UPDATE_GOLDENS === '1') writeFileSync(fixture.golden, actual);
    // A captured config.json without a golden still has to decode (invariants.test.ts checks what it says).
    if (!fixture.synthetic && !existsSync(fixture.golden)) return;
    expect(actual).toBe(readFileSync(fixture.golden, 'utf8'));
    expect(render(decode(fixture.name))).toBe(actual);
  });
});
