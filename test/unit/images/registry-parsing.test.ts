import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { credentialsFromAuthConfig, normaliseServerAddress, parseWwwAuthenticate } from '../../../src/images/registry/auth.js';
import { RegistryClient } from '../../../src/images/registry/client.js';
import { loadRegistriesConfig, parseRegistriesConfig, settingsFor } from '../../../src/images/registry/config.js';

describe('WWW-Authenticate parsing', () => {
  it('reads a Docker Hub bearer challenge', () => {
    expect(
      parseWwwAuthenticate(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull"',
      ),
    ).toEqual([
      {
        scheme: 'bearer',
        params: { realm: 'https://auth.docker.io/token', service: 'registry.docker.io', scope: 'repository:library/busybox:pull' },
      },
    ]);
  });

  it('reads several challenges, token values, escapes and commas inside quotes', () => {
    expect(parseWwwAuthenticate('Basic realm="a \\"quoted\\" realm", Bearer realm="https://x/t?a=1,b=2", error=invalid_token')).toEqual([
      { scheme: 'basic', params: { realm: 'a "quoted" realm' } },
      { scheme: 'bearer', params: { realm: 'https://x/t?a=1,b=2', error: 'invalid_token' } },
    ]);
    expect(parseWwwAuthenticate('')).toEqual([]);
  });
});

describe('AuthConfig decoding', () => {
  it('prefers username/password, else decodes auth, and keeps tokens', () => {
    expect(credentialsFromAuthConfig({ username: 'u', password: 'p', auth: 'ignored' })?.basic).toEqual({ username: 'u', password: 'p' });
    expect(credentialsFromAuthConfig({ auth: Buffer.from('me:pa:ss').toString('base64') })?.basic).toEqual({
      username: 'me',
      password: 'pa:ss',
    });
    expect(credentialsFromAuthConfig({ identity_token: 'refresh', server_address: 'https://index.docker.io/v1/' })).toEqual({
      basic: undefined,
      identityToken: 'refresh',
      registryToken: undefined,
      serverHost: 'docker.io',
    });
    expect(credentialsFromAuthConfig({})).toBeUndefined();
    expect(credentialsFromAuthConfig(null)).toBeUndefined();
    expect(() => credentialsFromAuthConfig({ auth: '!!!' })).toThrow(/auth\.auth/);
    // A token goes into an HTTP header: CR/LF, spaces or non-ASCII are refused, never sent.
    expect(() => credentialsFromAuthConfig({ registry_token: 'a\r\nX-Evil: 1' })).toThrow(/auth\.registry_token/);
    expect(() => credentialsFromAuthConfig({ identity_token: 'é' })).toThrow(/auth\.identity_token/);
  });

  it('normalises server addresses', () => {
    expect(normaliseServerAddress('http://127.0.0.1:5000/v2/')).toBe('127.0.0.1:5000');
    expect(normaliseServerAddress('registry-1.docker.io')).toBe('docker.io');
    expect(normaliseServerAddress('Quay.IO')).toBe('quay.io');
    expect(normaliseServerAddress('')).toBeUndefined();
  });
});

describe('registries file', () => {
  const config = parseRegistriesConfig(
    {
      registries: {
        'docker.io': { mirrors: ['127.0.0.1:5001', 'https://mirror.example.com'] },
        'localhost:5000': { plainHttp: true },
        '127.0.0.1:*': { plainHttp: true },
        '*.corp.example': { skipTlsVerify: true },
        'a.corp.example': { plainHttp: true },
      },
    },
    'test',
  );

  it('picks the most specific host pattern', () => {
    expect(settingsFor(config, 'localhost:5000')).toEqual({ mirrors: [], plainHttp: true, skipTlsVerify: false });
    expect(settingsFor(config, 'localhost:5001').plainHttp).toBe(false);
    expect(settingsFor(config, '127.0.0.1:39999').plainHttp).toBe(true);
    expect(settingsFor(config, '127.0.0.1').plainHttp).toBe(true);
    expect(settingsFor(config, 'b.corp.example:443')).toEqual({ mirrors: [], plainHttp: false, skipTlsVerify: true });
    expect(settingsFor(config, 'a.corp.example')).toEqual({ mirrors: [], plainHttp: true, skipTlsVerify: false });
    expect(settingsFor(config, 'quay.io')).toEqual({ mirrors: [], plainHttp: false, skipTlsVerify: false });
  });

  it('orders endpoints mirrors first, each with its own scheme, Docker Hub on its API host last', () => {
    const client = new RegistryClient({ registries: config, logger: silentLogger() });
    try {
      expect(client.endpointsFor('docker.io').map((e) => [e.origin.origin, e.mirror])).toEqual([
        ['http://127.0.0.1:5001', true],
        ['https://mirror.example.com', true],
        ['https://registry-1.docker.io', false],
      ]);
      expect(client.endpointsFor('localhost:5000').map((e) => e.origin.origin)).toEqual(['http://localhost:5000']);
    } finally {
      client.close();
    }
  });

  it('rejects unknown keys and bad patterns, naming each', () => {
    try {
      parseRegistriesConfig({ registries: { 'ok:*': { mirror: [] }, 'bad host': {} }, extra: 1 }, '/etc/kata-ts/registries.json');
      expect.unreachable();
    } catch (err) {
      expect(err).toMatchObject({ kind: 'invalid', reason: 'REGISTRIES_CONFIG_INVALID' });
      const msg = (err as Error).message;
      expect(msg).toContain('/registries/ok:*/mirror is not a known key');
      expect(msg).toContain('/extra is not a known key');
      expect(msg).toContain('bad host');
    }
  });

  it('loads from a file; null means none; a missing file is NOT_FOUND', async () => {
    expect(await loadRegistriesConfig(null)).toEqual({ registries: {} });
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-registries-'));
    try {
      const file = path.join(dir, 'r.json');
      await fsp.writeFile(file, JSON.stringify({ registries: { 'localhost:5000': { plainHttp: true } } }));
      expect(settingsFor(await loadRegistriesConfig(file), 'localhost:5000').plainHttp).toBe(true);
      await expect(loadRegistriesConfig(path.join(dir, 'missing.json'))).rejects.toMatchObject({
        kind: 'not_found',
        reason: 'REGISTRIES_CONFIG_NOT_FOUND',
      });
      await fsp.writeFile(file, '{not json');
      await expect(loadRegistriesConfig(file)).rejects.toMatchObject({ kind: 'invalid', reason: 'REGISTRIES_CONFIG_INVALID' });
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('accepts the example file shipped in fixtures/images', async () => {
    const file = path.join(import.meta.dirname, '../../../fixtures/images/registries.example.json');
    const cfg = await loadRegistriesConfig(file);
    expect(settingsFor(cfg, 'localhost:5000').plainHttp).toBe(true);
  });
});
