import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { buildOciSpec, type OciSpecInput } from '../../../src/oci/index.js';
import { mergeEnv } from '../../../src/oci/process.js';
import { resolveUser } from '../../../src/oci/user.js';
import { loadInput } from './load.js';

const key = fc.stringMatching(/^[A-Z_][A-Z0-9_]{0,6}$/);
const value = fc.string({ maxLength: 12 }).filter((s) => !s.includes('\0'));
const word = fc.string({ minLength: 1, maxLength: 16 }).filter((s) => !s.includes('\0'));

function deepFreeze<T>(o: T): T {
  if (typeof o === 'object' && o !== null) {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

describe('buildOciSpec properties', () => {
  it('env: the request always wins, every key appears once', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(key, value), { maxLength: 8 }), fc.array(fc.tuple(key, value), { maxLength: 8 }), (image, request) => {
        const env = mergeEnv({ envs: request.map(([k, v]) => ({ key: k, value: v })) }, { Env: image.map(([k, v]) => `${k}=${v}`) }, {});
        const keys = env.map((e) => e.slice(0, e.indexOf('=')));
        expect(new Set(keys).size).toBe(keys.length);
        const lastByKey = new Map(request);
        for (const [k, v] of lastByKey) expect(env).toContain(`${k}=${v}`);
        for (const [k, v] of new Map(image)) if (!lastByKey.has(k)) expect(env).toContain(`${k}=${v}`);
      }),
    );
  });

  it('argv: exactly the command and args elements, never joined into a shell line', () => {
    const base = loadInput('busybox-default');
    fc.assert(
      fc.property(fc.array(word, { minLength: 1, maxLength: 4 }), fc.array(word, { maxLength: 4 }), (command, args) => {
        fc.pre(command[0] !== '');
        const input: OciSpecInput = { ...base, container: { ...base.container, command, args } };
        const { spec } = buildOciSpec(input);
        expect(spec.process!.args).toEqual([...command, ...args]);
      }),
      { numRuns: 50 },
    );
  });

  it('groups: the primary gid first, no repeats', () => {
    const gid = fc.integer({ min: 0, max: 70000 });
    fc.assert(
      fc.property(gid, fc.array(gid, { maxLength: 6 }), fc.boolean(), (primary, extra, strict) => {
        const { user } = resolveUser(
          {
            run_as_user: { value: '1000' },
            run_as_group: { value: String(primary) },
            supplemental_groups: extra.map(String),
            supplemental_groups_policy: strict ? 'Strict' : 'Merge',
          },
          null,
          'app:x:1000:1000::/home/app:/bin/sh\n',
          `g1:x:${extra[0] ?? 5}:app\n`,
        );
        expect(user.additionalGids![0]).toBe(primary);
        expect(new Set(user.additionalGids!).size).toBe(user.additionalGids!.length);
        for (const g of extra) expect(user.additionalGids).toContain(g);
      }),
    );
  });

  it('pure: leaves its (frozen) input alone and gives equal output for equal input', () => {
    for (const name of ['busybox-default', 'nginx-passwd-user', 'privileged-node-agent', 'localhost-seccomp']) {
      const frozen = deepFreeze(loadInput(name));
      expect(buildOciSpec(frozen)).toEqual(buildOciSpec(loadInput(name)));
    }
  });
});
