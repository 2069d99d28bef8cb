/**
 * The broker a pod's initdata names (guest/agent/attest/config.ts): CoCo's aa.toml and cdh.toml
 * shapes, https only, the certificate required and parsed, every refusal naming the key; and the
 * attester off without initdata or without a broker, refusing resources saying so.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { attestConfigFromDocument, readAttestConfig } from '../../../guest/agent/attest/config.js';
import { createAttester } from '../../../guest/agent/attest/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { rejection, thrown } from '../../helpers/kata-error.js';

// Any real certificate will do for parsing; this one is a fixture of the attest tests.
const CERT = readFileSync(path.join(packageRoot(), 'test/fixtures/attest/tdx/intel-sgx-root-ca.pem'), 'utf8').trim();

/** An initdata document whose [data] holds `entries` (TOML multi-line literal strings). */
function doc(entries: Record<string, string>): Buffer {
  const data = Object.entries(entries)
    .map(([k, v]) => `"${k}" = '''\n${v}\n'''`)
    .join('\n');
  return Buffer.from(`version = "0.1.0"\nalgorithm = "sha256"\n[data]\n${data}\n`);
}

const aa = (url: string, cert: string | null = CERT) =>
  `[token_configs]\n[token_configs.coco_as]\nurl = "https://as.example"\n[token_configs.kbs]\nurl = "${url}"\n${cert === null ? '' : `cert = """\n${cert}\n"""`}`;
const cdh = (url: string, cert: string | null = CERT) =>
  `socket = "unix:///run/cdh.sock"\ncredentials = []\n[kbc]\nname = "cc_kbc"\nurl = "${url}"\n${cert === null ? '' : `kbs_cert = """\n${cert}\n"""`}`;

function field(fn: () => unknown): { reason: string; field: unknown; message: string } {
  const e = thrown(fn);
  return { reason: e.reason, field: e.details?.field, message: e.message };
}

describe('the broker from initdata', () => {
  it('aa.toml [token_configs.kbs] url and cert', () => {
    const c = attestConfigFromDocument(doc({ 'aa.toml': aa('https://broker.example:8443/') }));
    expect(c.kind).toBe('broker');
    if (c.kind !== 'broker') return;
    expect(c.broker.url).toBe('https://broker.example:8443');
    expect(c.broker.caPem).toContain('-----BEGIN CERTIFICATE-----');
    expect(c.broker.source).toBe('data."aa.toml".token_configs.kbs');
    expect(c.initdata.data['aa.toml']).toContain('broker.example');
  });

  it('cdh.toml [kbc] url and kbs_cert', () => {
    const c = attestConfigFromDocument(doc({ 'cdh.toml': cdh('https://10.0.0.1:8080') }));
    expect(c.kind === 'broker' && c.broker).toMatchObject({ url: 'https://10.0.0.1:8080', source: 'data."cdh.toml".kbc' });
  });

  it('both, when they agree; aa.toml names it', () => {
    const c = attestConfigFromDocument(doc({ 'aa.toml': aa('https://b.example'), 'cdh.toml': cdh('https://b.example') }));
    expect(c.kind === 'broker' && c.broker.source).toBe('data."aa.toml".token_configs.kbs');
  });

  it('no broker: an initdata with other data, an aa.toml without a kbs table', () => {
    expect(attestConfigFromDocument(doc({ 'policy.rego': 'package agent_policy' })).kind).toBe('no-broker');
    expect(attestConfigFromDocument(doc({ 'aa.toml': '[token_configs.coco_as]\nurl = "https://as"' })).kind).toBe('no-broker');
  });

  it('refuses each bad key by name', () => {
    const cases: Array<[Record<string, string>, string]> = [
      [{ 'aa.toml': aa('http://broker.example') }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': aa('https://user:pw@broker.example') }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': aa('https://broker.example/?x=1') }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': aa('not a url') }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': aa('https://broker.example', null) }, 'data."aa.toml".token_configs.kbs.cert'],
      [{ 'aa.toml': aa('https://broker.example', 'no pem here') }, 'data."aa.toml".token_configs.kbs.cert'],
      [
        { 'aa.toml': aa('https://broker.example', '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----') },
        'data."aa.toml".token_configs.kbs.cert',
      ],
      [{ 'aa.toml': '[token_configs.kbs]\nurl = 3' }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': '[token_configs.kbs]\ncert = "x"' }, 'data."aa.toml".token_configs.kbs.url'],
      [{ 'aa.toml': 'token_configs = 1' }, 'data."aa.toml".token_configs'],
      [{ 'aa.toml': '[[[' }, 'data."aa.toml"'],
      [{ 'cdh.toml': cdh('ftp://broker.example') }, 'data."cdh.toml".kbc.url'],
      [{ 'cdh.toml': cdh('https://broker.example', null) }, 'data."cdh.toml".kbc.kbs_cert'],
      [{ 'aa.toml': aa('https://a.example'), 'cdh.toml': cdh('https://b.example') }, 'data."cdh.toml".kbc.url'],
    ];
    for (const [entries, key] of cases) {
      const got = field(() => attestConfigFromDocument(doc(entries)));
      expect(got, JSON.stringify(entries).slice(0, 120)).toMatchObject({ reason: 'ATTEST_CONFIG_INVALID', field: key });
      expect(got.message).toContain(key);
    }
  });

  it('a document that is not initdata is refused as a whole', () => {
    expect(field(() => attestConfigFromDocument(Buffer.from('version = "9"\n')))).toMatchObject({
      reason: 'ATTEST_CONFIG_INVALID',
      field: 'document',
    });
  });
});

describe('the attester without a usable broker', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'attest-config-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const openTpm = () => Promise.reject(new Error('no TPM is opened when attestation is off'));

  it('no initdata: off; a resource is refused saying so, a bad name as such', async () => {
    const initdataPath = path.join(dir, 'absent.toml');
    expect(await readAttestConfig(initdataPath)).toEqual({ kind: 'no-initdata' });
    const a = createAttester({ openTpm, initdataPath, log: silentLogger() });
    a.start();
    expect(a.status()).toEqual({ state: 'off', broker: null, lastError: null });
    const e = await rejection(a.resource('kbs:///default/key/one'));
    expect(e.reason).toBe('ATTEST_OFF');
    expect(e.message).toContain('default/key/one');
    expect(e.message).toContain('no initdata');
    expect((await rejection(a.resource('default/../one'))).reason).toBe('ATTEST_RESOURCE_PATH_INVALID');
  });

  it('initdata without a broker: off, saying the initdata names none', async () => {
    const initdataPath = path.join(dir, 'nobroker.toml');
    writeFileSync(initdataPath, doc({ 'policy.rego': 'package x' }));
    const a = createAttester({ openTpm, initdataPath, log: silentLogger() });
    const e = await rejection(a.resource('default/key/one'));
    expect(e.reason).toBe('ATTEST_OFF');
    expect(e.message).toContain('names no broker');
  });

  it('an invalid broker: off, status and every resource carry the error naming the key', async () => {
    const initdataPath = path.join(dir, 'bad.toml');
    writeFileSync(initdataPath, doc({ 'aa.toml': aa('http://broker.example') }));
    const a = createAttester({ openTpm, initdataPath, log: silentLogger() });
    expect(a.status()).toMatchObject({ state: 'off', broker: null, lastError: { reason: 'ATTEST_CONFIG_INVALID' } });
    const e = await rejection(a.resource('default/key/one'));
    expect(e.reason).toBe('ATTEST_CONFIG_INVALID');
    expect(e.details?.field).toBe('data."aa.toml".token_configs.kbs.url');
  });
});
