import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { isKataError, type KataError } from '../../../src/common/errors.js';
import { parseInitdataAnnotation } from '../../../src/measure/initdata.js';
import {
  checkPodSecretsAttestable,
  initdataBrokerUrl,
  POD_SECRETS_ANNOTATION_MAX_CHARS,
  POD_SECRETS_MAX_PER_CONTAINER,
  podSecretsFor,
  podSecretsFromAnnotations,
} from '../../../src/runtime/sandbox/pod-secrets.js';

const KEY = 'io.kata-ts.secrets';
/** The annotation with `list` for container app. */
const app = (list: unknown) => JSON.stringify({ app: list });

function caught(fn: () => unknown): KataError {
  try {
    fn();
  } catch (err) {
    if (isKataError(err)) return err;
    throw err;
  }
  throw new Error('expected a KataError');
}

function initdata(data: string): ReturnType<typeof parseInitdataAnnotation> {
  const doc = `version = "0.1.0"\nalgorithm = "sha256"\n[data]\n${data}`;
  return parseInitdataAnnotation(gzipSync(Buffer.from(doc)).toString('base64'), 'io.kata-ts.initdata');
}

const BROKER_INITDATA = initdata(`"aa.toml" = '''
[token_configs.kbs]
url = "https://10.88.0.1:8443"
'''
`);

describe('pod secret annotations', () => {
  it('decodes each container list, canonical resource names, in order', () => {
    const secrets = podSecretsFromAnnotations({
      [KEY]: JSON.stringify({
        app: [
          { resource: 'kbs:///default/db/password', path: '/run/secrets/db-password' },
          { resource: 'kbs:///default/tls/key.pem', path: '/etc/tls/key.pem' },
        ],
        sidecar: [{ resource: 'kbs:///r/t/x', path: '/x' }],
      }),
      'io.kata-ts.secrets/app': 'ignored: not the annotation',
    });
    expect(secrets).toEqual({
      app: [
        { resource: 'default/db/password', path: '/run/secrets/db-password' },
        { resource: 'default/tls/key.pem', path: '/etc/tls/key.pem' },
      ],
      sidecar: [{ resource: 'r/t/x', path: '/x' }],
    });
    expect(podSecretsFor(secrets, 'app')).toHaveLength(2);
    expect(podSecretsFor(secrets, 'other')).toEqual([]);
    expect(podSecretsFor(undefined, 'app')).toEqual([]);
    expect(podSecretsFromAnnotations({})).toEqual({});
    expect(podSecretsFromAnnotations(undefined)).toEqual({});
  });

  const one = (entry: unknown) => app([entry]);
  const bad: Array<[string, string, RegExp]> = [
    ['bad JSON', '{"app":[{"resource":', /is not JSON/],
    ['not an object', '[{"resource":"kbs:///a/b/c","path":"/a"}]', /must be a JSON object from container name/],
    ['no container', '{}', /names no container/],
    ['a list not an array', app({ resource: 'kbs:///a/b/c', path: '/a' }), /"app" must be a JSON array/],
    ['an empty list', app([]), /"app" is an empty list/],
    ['an entry not an object', app(['kbs:///a/b/c']), /"app"\[0\] is not an object/],
    ['an unknown field', one({ resource: 'kbs:///a/b/c', path: '/a', mode: 420 }), /unknown field "mode"/],
    ['a resource not a string', one({ resource: 3, path: '/a' }), /"app"\[0\]\.resource must be a string/],
    ['a path not a string', one({ resource: 'kbs:///a/b/c' }), /"app"\[0\]\.path must be a string/],
    ['a resource not a kbs URI', one({ resource: 'https://x/a/b/c', path: '/a' }), /must start with kbs:\/\//],
    ['a bare resource path', one({ resource: 'a/b/c', path: '/a' }), /must start with kbs:\/\//],
    ['a resource of two segments', one({ resource: 'kbs:///a/b', path: '/a' }), /3 segments/],
    ['a traversing resource', one({ resource: 'kbs:///a/../c', path: '/a' }), /must be letters, digits/],
    ['an encoded resource', one({ resource: 'kbs:///a/b/%2e%2e', path: '/a' }), /must not carry/],
    ['a resource naming a host', one({ resource: 'kbs://evil.example/a/b/c', path: '/a' }), /names a host.*kbs:\/\/\/a\/b\/c/],
    ['a relative path', one({ resource: 'kbs:///a/b/c', path: 'run/secret' }), /is relative/],
    ['an empty path', one({ resource: 'kbs:///a/b/c', path: '' }), /is empty/],
    ['the root', one({ resource: 'kbs:///a/b/c', path: '/' }), /is the root directory/],
    ['a traversing path', one({ resource: 'kbs:///a/b/c', path: '/run/../etc/shadow' }), /traverses/],
    ['an unnormalised path', one({ resource: 'kbs:///a/b/c', path: '/run//secret' }), /is not normalised/],
    ['a trailing slash', one({ resource: 'kbs:///a/b/c', path: '/run/secret/' }), /is not normalised/],
    ['a path under /proc', one({ resource: 'kbs:///a/b/c', path: '/proc/self/environ' }), /under \/proc/],
    ['a NUL byte', one({ resource: 'kbs:///a/b/c', path: '/run/a\0b' }), /NUL byte/],
    ['a long path', one({ resource: 'kbs:///a/b/c', path: `/${'a'.repeat(1100)}` }), /characters, over/],
    [
      'a duplicate path',
      app([
        { resource: 'kbs:///a/b/c', path: '/run/s' },
        { resource: 'kbs:///a/b/d', path: '/run/s' },
      ]),
      /"app"\[1\]\.path "\/run\/s" is also "app"\[0\]\.path/,
    ],
    [
      'a path under another',
      app([
        { resource: 'kbs:///a/b/c', path: '/run/s/inner' },
        { resource: 'kbs:///a/b/d', path: '/run/s' },
      ]),
      /"app"\[0\]\.path "\/run\/s\/inner" is under "app"\[1\]\.path "\/run\/s", which is a file/,
    ],
    [
      'too many',
      app(Array.from({ length: POD_SECRETS_MAX_PER_CONTAINER + 1 }, (_, i) => ({ resource: 'kbs:///a/b/c', path: `/s/${i}` }))),
      /names 17 resources, more than the 16 allowed/,
    ],
    ['an oversized value', ' '.repeat(POD_SECRETS_ANNOTATION_MAX_CHARS + 1), /characters, more than the 65536 allowed/],
  ];
  it.each(bad)('refuses %s, naming the annotation', (_what, value, message) => {
    const err = caught(() => podSecretsFromAnnotations({ [KEY]: value }));
    expect(err.reason).toBe('POD_SECRETS_ANNOTATION_INVALID');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^annotation io\.kata-ts\.secrets: /);
    expect(err.message).toMatch(message);
    expect(err.details).toEqual({ field: 'annotations["io.kata-ts.secrets"]' });
  });

  it('refuses a name that is no container name, and too many containers', () => {
    for (const name of ['', 'App', '-app', `a${'b'.repeat(63)}`, 'a_b', 'a/b']) {
      const err = caught(() =>
        podSecretsFromAnnotations({ [KEY]: JSON.stringify({ [name]: [{ resource: 'kbs:///a/b/c', path: '/s' }] }) }),
      );
      expect(err.reason).toBe('POD_SECRETS_ANNOTATION_INVALID');
      expect(err.message).toContain(`annotation io.kata-ts.secrets: ${JSON.stringify(name)} is not a container name`);
    }
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`c${i}`, [{ resource: 'kbs:///a/b/c', path: '/s' }]]));
    expect(caught(() => podSecretsFromAnnotations({ [KEY]: JSON.stringify(many) })).message).toMatch(
      /names 65 containers, more than the 64/,
    );
  });
});

describe('the pod can attest', () => {
  const secrets = podSecretsFromAnnotations({ [KEY]: app([{ resource: 'kbs:///a/b/c', path: '/run/s' }]) });

  it('is refused on a handler without a TEE, naming the annotation and the handler', () => {
    const err = caught(() => checkPodSecretsAttestable(secrets, 'none', 'kata-ts', BROKER_INITDATA));
    expect(err.reason).toBe('POD_SECRETS_NO_TEE');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^annotation io\.kata-ts\.secrets: handler "kata-ts" has no TEE/);
  });

  it('is refused without initdata, or with one that names no broker', () => {
    const none = caught(() => checkPodSecretsAttestable(secrets, 'vtpm', 'kata-ts-cvm', null));
    expect(none.reason).toBe('POD_SECRETS_NO_BROKER');
    expect(none.message).toMatch(/^annotation io\.kata-ts\.secrets: the pod's initdata is missing/);
    const noBroker = caught(() => checkPodSecretsAttestable(secrets, 'vtpm', 'kata-ts-cvm', initdata('"policy.rego" = "package x"\n')));
    expect(noBroker.reason).toBe('POD_SECRETS_NO_BROKER');
    expect(noBroker.message).toContain('(annotation io.kata-ts.initdata) names no broker');
  });

  it('passes on a TEE with a broker, and with no secrets at all whatever the pod', () => {
    expect(() => checkPodSecretsAttestable(secrets, 'vtpm', 'kata-ts-cvm', BROKER_INITDATA)).not.toThrow();
    expect(() => checkPodSecretsAttestable({}, 'none', 'kata-ts', null)).not.toThrow();
  });

  it("reads the broker from aa.toml's [token_configs.kbs] or cdh.toml's [kbc]", () => {
    expect(initdataBrokerUrl(BROKER_INITDATA)).toBe('https://10.88.0.1:8443');
    expect(initdataBrokerUrl(initdata(`"cdh.toml" = '''\n[kbc]\nname = "cc_kbc"\nurl = "https://b:1"\n'''\n`))).toBe('https://b:1');
    expect(initdataBrokerUrl(initdata(`"aa.toml" = "not = [toml"\n`))).toBeNull();
    expect(initdataBrokerUrl(initdata(`"aa.toml" = '''\n[token_configs.kbs]\nurl = 3\n'''\n`))).toBeNull();
  });
});
