import { X509Certificate } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BROKER_POLICY_SCHEMA } from '../../../src/broker/policy.js';
import {
  type BrokerPaths,
  brokerPaths,
  checkBrokerDir,
  initBrokerState,
  parseSans,
  tlsCreateArgv,
  validateBrokerDir,
} from '../../../src/broker/state.js';
import {
  addReference,
  deleteReference,
  deleteResource,
  LiveConfig,
  listReferenceNames,
  listResources,
  readPolicy,
  setPolicy,
  setResource,
} from '../../../src/broker/store.js';
import { TokenSigner } from '../../../src/broker/token.js';
import { isReason } from '../../../src/common/errors.js';
import { hex, MemorySink, vtpmReference } from './fixtures.js';

let tmp: string;
let paths: BrokerPaths;

beforeEach(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-broker-'));
  paths = (await initBrokerState(path.join(tmp, 'state'), ['DNS:localhost', 'IP:127.0.0.1', 'IP:10.0.2.2'])).paths;
});
afterEach(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

async function mode(p: string): Promise<string> {
  return ((await fsp.stat(p)).mode & 0o777).toString(8);
}

describe('broker init', () => {
  it('makes the state dir 0700 with a TLS pair for the SANs, a token key, an empty policy', async () => {
    expect(await mode(paths.root)).toBe('700');
    expect(await mode(paths.tlsKey)).toBe('600');
    expect(await mode(paths.tokenKey)).toBe('600');
    const cert = new X509Certificate(await fsp.readFile(paths.tlsCert));
    expect(cert.subjectAltName).toBe('DNS:localhost, IP Address:127.0.0.1, IP Address:10.0.2.2');
    expect(cert.checkPrivateKey((await import('node:crypto')).createPrivateKey(await fsp.readFile(paths.tlsKey)))).toBe(true);
    TokenSigner.fromPem(await fsp.readFile(paths.tokenKey, 'utf8'));
    expect(await readPolicy(paths)).toEqual({ schema: BROKER_POLICY_SCHEMA, resources: [] });
    await checkBrokerDir(paths.root);
  });

  it('keeps an initialised dir as it is (the certificate pods carry never changes)', async () => {
    const before = await fsp.readFile(paths.tlsCert, 'utf8');
    const again = await initBrokerState(paths.root, ['DNS:other']);
    expect(again.created).toBe(false);
    expect(await fsp.readFile(paths.tlsCert, 'utf8')).toBe(before);
  });

  it('leaves nothing behind when openssl fails (an IP SAN it cannot parse)', async () => {
    const root = path.join(tmp, 'failed');
    await expect(initBrokerState(root, ['IP:not-an-address'])).rejects.toSatisfy((e) => isReason(e, 'BROKER_TLS_CREATE_FAILED'));
    await expect(fsp.access(root)).rejects.toThrow();
  });

  it('checks --san and --dir', () => {
    expect(parseSans([])).toEqual(['DNS:localhost', 'IP:127.0.0.1']);
    expect(parseSans(['DNS:kbs.lab,IP:10.0.2.2', 'IP:fd00::1', 'DNS:kbs.lab'])).toEqual(['DNS:kbs.lab', 'IP:10.0.2.2', 'IP:fd00::1']);
    for (const bad of ['kbs.lab', 'DNS:', 'DNS:a b', 'IP:300.1.1.1', 'URI:x', 'DNS:a=b', 'email:x@y'])
      expect(() => parseSans([bad]), bad).toThrow(/--san/);
    expect(tlsCreateArgv('/d', ['DNS:a', 'IP:1.2.3.4'])).toContain('subjectAltName=DNS:a,IP:1.2.3.4');
    for (const bad of ['relative', '/', '/a/../b', '/a/']) expect(() => validateBrokerDir(bad), bad).toThrow(/--dir/);
  });

  it('refuses a state dir open to others or a link', async () => {
    await fsp.chmod(paths.root, 0o755);
    await expect(checkBrokerDir(paths.root)).rejects.toThrow(/open to others/);
    await fsp.chmod(paths.root, 0o700);
    const link = path.join(tmp, 'link');
    await fsp.symlink(paths.root, link);
    await expect(checkBrokerDir(link)).rejects.toThrow(/not a directory this user owns/);
    await expect(checkBrokerDir(path.join(tmp, 'none'))).rejects.toThrow(/does not exist; run kata-ts broker init/);
  });
});

describe('admin changes', () => {
  it('stores resources 0600 under resources/<repo>/<type>/<tag>, lists sizes, deletes', async () => {
    await setResource(paths, 'lab/key/web', Buffer.from('secret'));
    expect(await mode(path.join(paths.resourcesDir, 'lab/key/web'))).toBe('600');
    expect(await mode(path.join(paths.resourcesDir, 'lab/key'))).toBe('700');
    expect(await listResources(paths)).toEqual([{ path: 'lab/key/web', bytes: 6 }]);
    await deleteResource(paths, 'lab/key/web');
    expect(await listResources(paths)).toEqual([]);
    await expect(deleteResource(paths, 'lab/key/web')).rejects.toSatisfy((e) => isReason(e, 'BROKER_RESOURCE_NOT_FOUND'));
    await expect(setResource(paths, 'lab/../x', Buffer.from('x'))).rejects.toSatisfy((e) => isReason(e, 'ATTEST_RESOURCE_PATH_INVALID'));
    await expect(setResource(paths, 'lab/key/big', Buffer.alloc(1024 * 1024 + 1))).rejects.toSatisfy((e) =>
      isReason(e, 'BROKER_RESOURCE_INVALID'),
    );
  });

  it('stores reference sets by name, refuses bad ones without writing', async () => {
    await addReference(paths, 'web', vtpmReference({ '4': hex('4') }), 'rv.json');
    await expect(addReference(paths, 'bad', { schema: 'x' }, 'rv.json')).rejects.toSatisfy((e) => isReason(e, 'BROKER_REFERENCE_INVALID'));
    await expect(addReference(paths, '../x', vtpmReference({}), 'rv.json')).rejects.toSatisfy((e) =>
      isReason(e, 'BROKER_REFERENCE_INVALID'),
    );
    expect(await listReferenceNames(paths)).toEqual(['web']);
    await deleteReference(paths, 'web');
    await expect(deleteReference(paths, 'web')).rejects.toSatisfy((e) => isReason(e, 'BROKER_REFERENCE_NOT_FOUND'));
  });

  it('refuses a bad policy and keeps the stored one', async () => {
    await setPolicy(paths, { schema: BROKER_POLICY_SCHEMA, resources: [{ path: 'a/b/c', allow: ['web'] }] });
    await expect(setPolicy(paths, { schema: BROKER_POLICY_SCHEMA, resources: [{ path: 'a/b' }] })).rejects.toSatisfy((e) =>
      isReason(e, 'BROKER_POLICY_INVALID'),
    );
    expect((await readPolicy(paths)).resources).toEqual([{ path: 'a/b/c', allow: ['web'] }]);
  });
});

describe('the live configuration of serve', () => {
  it('picks up policy and reference changes; a bad file keeps the old one and is logged once', async () => {
    const log = new MemorySink();
    const live = await LiveConfig.load(paths, log);
    expect(live.policy.resources).toEqual([]);
    expect(live.references.size).toBe(0);

    await setPolicy(paths, { schema: BROKER_POLICY_SCHEMA, resources: [{ path: 'a/b/c', allow: ['web'] }] });
    await addReference(paths, 'web', vtpmReference({ '4': hex('4') }), 'rv.json');
    await live.refresh();
    expect(live.policy.resources).toHaveLength(1);
    expect([...live.references.keys()]).toEqual(['web']);

    // An operator edits the files by hand, badly.
    await fsp.writeFile(paths.policy, '{"schema": "kata-ts/broker-policy/v1", "resources": [{"path": "a/b"}]}');
    await fsp.writeFile(path.join(paths.referencesDir, 'web.json'), '{not json');
    await fsp.writeFile(path.join(paths.referencesDir, 'new.json'), '{}');
    await live.refresh();
    await live.refresh();
    expect(live.policy.resources).toEqual([{ path: 'a/b/c', allow: ['web'] }]);
    expect([...live.references.keys()]).toEqual(['web']);
    const kept = log.lines.filter((l) => l.outcome === 'kept');
    expect(kept.map((l) => [l.what, l.name ?? null])).toEqual([
      ['policy', null],
      ['reference', 'new'],
      ['reference', 'web'],
    ]);
    expect(kept[0]?.why).toContain("/resources/0 must have required property 'allow'");

    await fsp.rm(path.join(paths.referencesDir, 'web.json'));
    await live.refresh();
    expect(live.references.size).toBe(0);
  });

  it('loads a change once when requests refresh concurrently', async () => {
    const log = new MemorySink();
    const live = await LiveConfig.load(paths, log);
    // A reference set is read after an await of its own: unserialised passes would each load it.
    await addReference(paths, 'web', vtpmReference({ '4': hex('4') }), 'rv.json');
    await Promise.all([live.refresh(), live.refresh(), live.refresh()]);
    expect(log.lines.filter((l) => l.what === 'reference' && l.outcome === 'reloaded')).toHaveLength(1);
    expect([...live.references.keys()]).toEqual(['web']);
  });

  it('reads resources without following links', async () => {
    const live = await LiveConfig.load(paths, new MemorySink());
    await setResource(paths, 'lab/key/web', Buffer.from('secret'));
    expect((await live.readResource('lab/key/web'))?.toString()).toBe('secret');
    expect(await live.readResource('lab/key/none')).toBeUndefined();
    await fsp.symlink(paths.tokenKey, path.join(paths.resourcesDir, 'lab/key/link'));
    await expect(live.readResource('lab/key/link')).rejects.toThrow();
  });
});

describe('paths', () => {
  it('are the documented layout', () => {
    const p = brokerPaths('/s');
    expect(p).toMatchObject({
      tlsKey: '/s/tls/key.pem',
      tlsCert: '/s/tls/cert.pem',
      tokenKey: '/s/token-key.pem',
      policy: '/s/policy.json',
      referencesDir: '/s/references',
      resourcesDir: '/s/resources',
      decisionsLog: '/s/decisions.log',
    });
  });
});
