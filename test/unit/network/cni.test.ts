import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadCniNetwork, networkReadiness, parseCniConfig } from '../../../src/network/cni-config.js';
import { pluginStdin } from '../../../src/network/cni-exec.js';
import { parseCniResult, podIps } from '../../../src/network/result.js';
import { planTapUnwiring, planTapWiring } from '../../../src/network/wiring.js';
import { thrown } from '../../helpers/kata-error.js';

function expectKataError(fn: () => unknown, reason: string, message?: RegExp): void {
  const err = thrown(fn);
  expect(err.reason).toBe(reason);
  if (message !== undefined) expect(err.message).toMatch(message);
}

const CONFLIST = {
  cniVersion: '1.0.0',
  name: 'podnet',
  plugins: [
    { type: 'bridge', bridge: 'cni0', isGateway: true, ipam: { type: 'host-local', ranges: [[{ subnet: '10.42.0.0/24' }]] } },
    { type: 'portmap', capabilities: { portMappings: true } },
  ],
};

describe('CNI network config', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kts-cni-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads a conflist, and a single-plugin .conf as a list of one', () => {
    const list = parseCniConfig(JSON.stringify(CONFLIST), '/x/10-pod.conflist');
    expect(list.plugins.map((p) => p.type)).toEqual(['bridge', 'portmap']);
    const single = parseCniConfig(JSON.stringify({ cniVersion: '0.4.0', name: 'one', type: 'ptp' }), '/x/1.conf');
    expect(single).toEqual({ cniVersion: '0.4.0', name: 'one', plugins: [{ type: 'ptp' }], file: '/x/1.conf' });
  });

  it('refuses what it cannot run, naming the field', () => {
    expectKataError(() => parseCniConfig('{', '/x/a.conflist'), 'CNI_CONFIG_INVALID');
    expectKataError(
      () => parseCniConfig(JSON.stringify({ ...CONFLIST, cniVersion: '0.2.0' }), '/x/a.conflist'),
      'CNI_CONFIG_INVALID',
      /cniVersion/,
    );
    expectKataError(() => parseCniConfig(JSON.stringify({ ...CONFLIST, plugins: [] }), '/x/a.conflist'), 'CNI_CONFIG_INVALID', /plugins/);
    expectKataError(
      () => parseCniConfig(JSON.stringify({ ...CONFLIST, plugins: [{ type: '../x' }] }), '/x/a.conflist'),
      'CNI_CONFIG_INVALID',
      /type/,
    );
  });

  it('takes the first file in lexical order, skipping disabled lists and other files', async () => {
    await writeFile(path.join(dir, 'README'), 'not a config');
    await writeFile(path.join(dir, '05-off.conflist'), JSON.stringify({ ...CONFLIST, name: 'off', disabled: true }));
    await writeFile(path.join(dir, '20-b.conflist'), JSON.stringify({ ...CONFLIST, name: 'b' }));
    await writeFile(path.join(dir, '10-a.conflist'), JSON.stringify({ ...CONFLIST, name: 'a' }));
    expect((await loadCniNetwork(dir)).name).toBe('a');
  });

  it('NetworkReady: false without a config, false naming a missing plugin, true when all exist', async () => {
    const bin = path.join(dir, 'bin');
    const conf = path.join(dir, 'net.d');
    const base = { mode: 'cni' as const, cniConfDir: conf, cniBinDirs: [bin], cniTimeoutMs: 1000 };
    expect(await networkReadiness(base)).toMatchObject({ ready: false, reason: 'NoCniConfig' });
    await import('node:fs/promises').then((f) => Promise.all([f.mkdir(conf), f.mkdir(bin)]));
    await writeFile(path.join(conf, '10.conflist'), JSON.stringify(CONFLIST));
    await writeFile(path.join(bin, 'bridge'), '#!/bin/sh\n');
    await chmod(path.join(bin, 'bridge'), 0o755);
    const missing = await networkReadiness(base);
    expect(missing).toMatchObject({ ready: false, reason: 'CniPluginMissing' });
    expect(missing.message).toContain('"portmap"');
    await writeFile(path.join(bin, 'portmap'), '#!/bin/sh\n');
    await chmod(path.join(bin, 'portmap'), 0o755);
    expect(await networkReadiness(base)).toMatchObject({ ready: true });
    expect(await networkReadiness({ ...base, mode: 'none' })).toMatchObject({ ready: false, reason: 'NetworkDisabled' });
  });
});

describe('plugin stdin', () => {
  const list = parseCniConfig(JSON.stringify(CONFLIST), '/x/10.conflist');
  it('gets the list name and version, runtimeConfig only for declared capabilities, prevResult when given', () => {
    const rc = { portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] };
    const bridge = pluginStdin(list, list.plugins[0]!, rc, undefined);
    expect(bridge).toMatchObject({ type: 'bridge', name: 'podnet', cniVersion: '1.0.0' });
    expect(bridge).not.toHaveProperty('runtimeConfig');
    expect(bridge).not.toHaveProperty('prevResult');
    const portmap = pluginStdin(list, list.plugins[1]!, rc, { ips: [] });
    expect(portmap).toMatchObject({ runtimeConfig: rc, prevResult: { ips: [] } });
  });
});

describe('CNI results', () => {
  const result = {
    cniVersion: '1.0.0',
    interfaces: [
      { name: 'cni0', mac: 'aa:aa:aa:aa:aa:aa' },
      { name: 'veth1', mac: 'bb:bb:bb:bb:bb:bb' },
      { name: 'eth0', mac: '0a:58:0a:2a:00:05', sandbox: '/run/netns/x' },
    ],
    ips: [
      { address: 'fd00::5/64', gateway: 'fd00::1', interface: 2 },
      { address: '10.42.0.5/24', gateway: '10.42.0.1', interface: 2 },
      { address: '10.99.0.1/24', interface: 0 },
    ],
    routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0', gw: 'fd00::1' }],
    dns: { nameservers: ['10.96.0.10'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
  };
  it('keeps the addresses of the pod interface, IPv4 first as the pod IP', () => {
    const r = parseCniResult(result, 'eth0');
    expect(r.ips).toEqual([
      { address: 'fd00::5', prefixLength: 64, family: 6, gateway: 'fd00::1' },
      { address: '10.42.0.5', prefixLength: 24, family: 4, gateway: '10.42.0.1' },
    ]);
    expect(podIps(r)).toEqual(['10.42.0.5', 'fd00::5']);
    expect(r.routes).toEqual([{ destination: '0.0.0.0/0' }, { destination: '::/0', gateway: 'fd00::1' }]);
    expect(r.dns).toEqual({ servers: ['10.96.0.10'], searches: ['cluster.local', 'svc.cluster.local'], options: ['ndots:5'] });
  });
  it('refuses a result without a pod address or with a bad one', () => {
    expectKataError(() => parseCniResult({ ips: [] }, 'eth0'), 'CNI_RESULT_INVALID', /ips/);
    expectKataError(() => parseCniResult({ ips: [{ address: '10.0.0.5' }] }, 'eth0'), 'CNI_RESULT_INVALID', /ips\[0\]\.address/);
  });
});

describe('TAP wiring (tcfilter)', () => {
  it('redirects both ways with ingress qdiscs and match-all u32 filters, in the pod namespace', () => {
    const cmds = planTapWiring('kata-ts-0123456789abcdef', 'eth0', 'tap0_kata', 1450);
    expect(cmds[0]).toEqual(['ip', '-n', 'kata-ts-0123456789abcdef', 'tuntap', 'add', 'dev', 'tap0_kata', 'mode', 'tap']);
    expect(cmds[1]).toContain('1450');
    const redirects = cmds.filter((c) => c.includes('mirred')).map((c) => [c[c.indexOf('dev') + 1], c.at(-1)]);
    expect(redirects).toEqual([
      ['eth0', 'tap0_kata'],
      ['tap0_kata', 'eth0'],
    ]);
    expect(cmds.every((c) => c[1] === '-n' && c[2] === 'kata-ts-0123456789abcdef')).toBe(true);
    expect(planTapUnwiring('ns', 'eth0', 'tap0_kata').map((c) => c.slice(3, 5))).toEqual([
      ['qdisc', 'del'],
      ['link', 'del'],
    ]);
  });
});
