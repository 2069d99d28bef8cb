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

const KEY = 'io.kata-ts.secrets/app';

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
      [KEY]: JSON.stringify([
        { resource: 'kbs:///default/db/password', path: '/run/secrets/db-password' },
        { resource: 'kbs:///default/tls/key.pem', path: '/etc/tls/key.pem' },
      ]),
      'io.kata-ts.secrets/sidecar': '[{"resource":"kbs:///r/t/x","path":"/x"}]',
      'unrelated/annotation': 'not json',
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

  const one = (entry: unknown) => JSON.stringify([entry]);
  const bad: Array<[string, string, RegExp]> = [
    ['bad JSON', '[{"resource":', /is not JSON/],
    ['not an array', '{"resource":"kbs:///a/b/c","path":"/a"}', /must be a JSON array/],
    ['an empty list', '[]', /the list is empty/],
    ['an entry not an object', '["kbs:///a/b/c"]', /\[0\] is not an object/],
    ['an unknown field', one({ resource: 'kbs:///a/b/c', path: '/a', mode: 420 }), /unknown field "mode"/],
    ['a resource not a string', one({ resource: 3, path: '/a' }), /\[0\]\.resource must be a string/],
    ['a path not a string', one({ resource: 'kbs:///a/b/c' }), /\[0\]\.path must be a string/],
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
      JSON.stringify([
        { resource: 'kbs:///a/b/c', path: '/run/s' },
        { resource: 'kbs:///a/b/d', path: '/run/s' },
      ]),
      /\[1\]\.path "\/run\/s" is also \[0\]\.path/,
    ],
    [
      'a path under another',
      JSON.stringify([
        { resource: 'kbs:///a/b/c', path: '/run/s/inner' },
        { resource: 'kbs:///a/b/d', path: '/run/s' },
      ]),
      /\[0\]\.path "\/run\/s\/inner" is under \[1\]\.path "\/run\/s", which is a file/,
    ],
    [
      'too many',
      JSON.stringify(Array.from({ length: POD_SECRETS_MAX_PER_CONTAINER + 1 }, (_, i) => ({ resource: 'kbs:///a/b/c', path: `/s/${i}` }))),
      /names 17 resources, more than the 16 allowed/,
    ],
    ['an oversized value', ' '.repeat(POD_SECRETS_ANNOTATION_MAX_CHARS + 1), /characters, more than the 16384 allowed/],
  ];
  it.each(bad)('refuses %s, naming the annotation', (_what, value, message) => {
    const err = caught(() => podSecretsFromAnnotations({ [KEY]: value }));
    expect(err.reason).toBe('POD_SECRETS_ANNOTATION_INVALID');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^annotation io\.kata-ts\.secrets\/app: /);
    expect(err.message).toMatch(message);
    expect(err.details).toEqual({ field: 'annotations["io.kata-ts.secrets/app"]' });
  });

  it('refuses a key that names no container', () => {
    for (const name of ['', 'App', '-app', `a${'b'.repeat(63)}`, 'a_b', 'a/b']) {
      const err = caught(() => podSecretsFromAnnotations({ [`io.kata-ts.secrets/${name}`]: '[]' }));
      expect(err.reason).toBe('POD_SECRETS_ANNOTATION_INVALID');
      expect(err.message).toContain(`annotation io.kata-ts.secrets/${name}: `);
      expect(err.message).toContain('is not a container name');
    }
  });
});

describe('the pod can attest', () => {
  const secrets = podSecretsFromAnnotations({ [KEY]: '[{"resource":"kbs:///a/b/c","path":"/run/s"}]' });

  it('is refused on a handler without a TEE, naming the annotation and the handler', () => {
    const err = caught(() => checkPodSecretsAttestable(secrets, 'none', 'kata-ts', BROKER_INITDATA));
    expect(err.reason).toBe('POD_SECRETS_NO_TEE');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^annotation io\.kata-ts\.secrets\/app: handler "kata-ts" has no TEE/);
  });

  it('is refused without initdata, or with one that names no broker', () => {
    const none = caught(() => checkPodSecretsAttestable(secrets, 'vtpm', 'kata-ts-cvm', null));
    expect(none.reason).toBe('POD_SECRETS_NO_BROKER');
    expect(none.message).toMatch(/^annotation io\.kata-ts\.secrets\/app: the pod's initdata is missing/);
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
