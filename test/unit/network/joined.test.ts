/**
 * The pure parts of joining a caller's network namespace: iproute2's JSON (as `ip -j` prints it
 * in a namespace containerd's CNI plugins attached) into the CNI result shape the guest is
 * configured from, how a path is reached (a name for `-n`, or nsenter), the TAP wiring planned
 * for either, and the ids a caller may choose.
 */
import { describe, expect, it } from 'vitest';
import { isCallerId, shortIdKey } from '../../../src/common/ids.js';
import { parseIpAddr, parseIpRoutes } from '../../../src/network/ip-json.js';
import { joinedNetnsName } from '../../../src/network/joined.js';
import { inNetns, netnsNameFor, planTapUnwiring, planTapWiring } from '../../../src/network/wiring.js';
import { thrown } from '../../helpers/kata-error.js';

/** `ip -j addr show` in a bridge-plugin pod namespace: lo, and eth0 dual-stack with a link-local address. */
const ADDR = [
  {
    ifindex: 1,
    ifname: 'lo',
    flags: ['LOOPBACK', 'UP', 'LOWER_UP'],
    mtu: 65536,
    address: '00:00:00:00:00:00',
    addr_info: [
      { family: 'inet', local: '127.0.0.1', prefixlen: 8, scope: 'host', label: 'lo' },
      { family: 'inet6', local: '::1', prefixlen: 128, scope: 'host' },
    ],
  },
  {
    ifindex: 3,
    link_index: 7,
    ifname: 'eth0',
    flags: ['BROADCAST', 'MULTICAST', 'UP', 'LOWER_UP'],
    mtu: 1450,
    link_type: 'ether',
    address: '0a:58:0a:f4:01:09',
    link_netnsid: 0,
    addr_info: [
      { family: 'inet', local: '10.244.1.9', prefixlen: 24, broadcast: '10.244.1.255', scope: 'global', label: 'eth0' },
      { family: 'inet6', local: 'fd00:10:244:1::9', prefixlen: 64, scope: 'global', tentative: true },
      { family: 'inet6', local: 'fd00:dead::9', prefixlen: 64, scope: 'global', dadfailed: true },
      { family: 'inet6', local: 'fe80::858:aff:fef4:109', prefixlen: 64, scope: 'link' },
    ],
  },
];

describe('parseIpAddr', () => {
  it('eth0: MAC, MTU and its global addresses (not link-local, not failed DAD); lo is not asked for', () => {
    expect(parseIpAddr(ADDR, 'eth0')).toEqual({
      mac: '0a:58:0a:f4:01:09',
      mtu: 1450,
      ips: [
        { address: '10.244.1.9', prefixLength: 24, family: 4 },
        { address: 'fd00:10:244:1::9', prefixLength: 64, family: 6 },
      ],
    });
  });

  it('no such interface: undefined; an interface without addresses: none', () => {
    expect(parseIpAddr(ADDR, 'net1')).toBeUndefined();
    expect(parseIpAddr([{ ifname: 'eth0', mtu: 1500, address: '0a:00:00:00:00:01' }], 'eth0')?.ips).toEqual([]);
  });

  it('output that is not what iproute2 prints is INTERNAL', () => {
    expect(thrown(() => parseIpAddr({ ifname: 'eth0' }, 'eth0')).reason).toBe('JOIN_NETNS_UNREADABLE');
    expect(thrown(() => parseIpAddr([{ ifname: 'eth0' }], 'eth0')).kind).toBe('internal');
  });
});

describe('parseIpRoutes', () => {
  it('bridge plugin: the default routes of both families, kernel routes left to the guest kernel', () => {
    const v4 = [
      { dst: 'default', gateway: '10.244.1.1', dev: 'eth0', flags: [] },
      { dst: '10.244.1.0/24', dev: 'eth0', protocol: 'kernel', scope: 'link', prefsrc: '10.244.1.9', flags: [] },
    ];
    const v6 = [
      { dst: 'fd00:10:244:1::/64', dev: 'eth0', protocol: 'kernel', metric: 256, flags: [], pref: 'medium' },
      { dst: 'fe80::/64', dev: 'eth0', protocol: 'kernel', metric: 256, flags: [], pref: 'medium' },
      { dst: 'default', gateway: 'fd00:10:244:1::1', dev: 'eth0', metric: 1024, flags: [], pref: 'medium' },
    ];
    expect(parseIpRoutes(v4, v6, 'eth0')).toEqual([
      { destination: '0.0.0.0/0', gateway: '10.244.1.1' },
      { destination: '::/0', gateway: 'fd00:10:244:1::1' },
    ]);
  });

  it("ptp / Calico: the gateway's on-link host route first, whatever order ip prints", () => {
    const v4 = [
      { dst: 'default', gateway: '169.254.1.1', dev: 'eth0', flags: [] },
      { dst: '169.254.1.1', dev: 'eth0', scope: 'link', flags: [] },
      { dst: '10.96.0.0/12', gateway: '169.254.1.1', dev: 'eth0', flags: [] },
    ];
    expect(parseIpRoutes(v4, [], 'eth0')).toEqual([
      { destination: '169.254.1.1/32' },
      { destination: '0.0.0.0/0', gateway: '169.254.1.1' },
      { destination: '10.96.0.0/12', gateway: '169.254.1.1' },
    ]);
  });

  it('an onlink gateway gets its own on-link route; other devices, other types and repeats are left out', () => {
    const v4 = [
      { dst: 'default', gateway: '192.168.0.1', dev: 'eth0', flags: ['onlink'] },
      { dst: 'default', gateway: '192.168.9.1', dev: 'eth0', metric: 200, flags: [] },
      { dst: '10.9.0.0/16', dev: 'net1', flags: [] },
      { type: 'unreachable', dst: '10.8.0.0/16', flags: [] },
      { type: 'blackhole', dst: '10.7.0.0/16', dev: 'eth0', flags: [] },
    ];
    expect(parseIpRoutes(v4, [{ dst: 'fd00::1', dev: 'eth0', flags: [] }], 'eth0')).toEqual([
      { destination: '192.168.0.1/32' },
      { destination: 'fd00::1/128' },
      { destination: '0.0.0.0/0', gateway: '192.168.0.1' },
    ]);
  });

  it('no routes at all (a namespace with only its address): none', () => {
    expect(parseIpRoutes([], [], 'eth0')).toEqual([]);
  });
});

describe('joinedNetnsName', () => {
  it('a path in /run/netns or /var/run/netns is used by name with -n; any other by path (nsenter)', () => {
    expect(joinedNetnsName('/run/netns/cni-1234')).toBe('cni-1234');
    expect(joinedNetnsName('/var/run/netns/cni-1234')).toBe('cni-1234');
    expect(joinedNetnsName('/proc/4242/ns/net')).toBeNull();
    expect(joinedNetnsName('/var/run/crio/ns/netns/abc')).toBeNull();
    expect(joinedNetnsName('/run/netns')).toBeNull();
  });

  it('anything but an absolute, normalised path is INVALID_ARGUMENT naming the field', () => {
    for (const p of ['', 'cni-1234', 'run/netns/x', '/run/netns/../x', '/run//netns/x', '/run/netns/x/', '/run/netns/x\0']) {
      const err = thrown(() => joinedNetnsName(p));
      expect([err.kind, err.reason, err.details]).toEqual(['invalid', 'JOIN_NETNS_INVALID', { field: 'joinNetns', joinNetns: p }]);
    }
  });
});

describe('TAP wiring into a namespace known by path', () => {
  it('every command runs under nsenter --net=PATH, the same commands as by name', () => {
    const byName = planTapWiring('cni-1234', 'eth0', 'tap0_kata', 1450);
    const byPath = planTapWiring({ path: '/proc/4242/ns/net' }, 'eth0', 'tap0_kata', 1450);
    expect(byPath.map((c) => c.slice(0, 4))).toEqual(byName.map((c) => ['nsenter', '--net=/proc/4242/ns/net', '--', c[0]]));
    expect(byPath.map((c) => c.slice(4))).toEqual(byName.map((c) => c.slice(3)));
    expect(planTapUnwiring({ path: '/x/ns' }, 'eth0', 'tap0_kata')).toEqual([
      ['nsenter', '--net=/x/ns', '--', 'tc', 'qdisc', 'del', 'dev', 'eth0', 'ingress'],
      ['nsenter', '--net=/x/ns', '--', 'ip', 'link', 'del', 'dev', 'tap0_kata'],
    ]);
    expect(inNetns('n', 'ip', ['-j', 'addr', 'show'])).toEqual(['ip', '-n', 'n', '-j', 'addr', 'show']);
  });
});

describe('caller ids', () => {
  it("containerd's identifier rule", () => {
    for (const ok of ['a', 'pod-1.web_2', 'b2'.repeat(32), 'x'.repeat(76), 'A9']) expect(isCallerId(ok)).toBe(true);
    for (const bad of ['', '.a', 'a.', 'a..b', 'a-_b', 'a b', 'a/b', 'x'.repeat(77), 'é']) expect(isCallerId(bad)).toBe(false);
  });

  it("short keys: an object id's own first 16 hex, any other id's hash (ids sharing a prefix differ)", () => {
    const hex = 'c3'.repeat(32);
    expect(shortIdKey(hex)).toBe(hex.slice(0, 16));
    expect(netnsNameFor(hex)).toBe(`kata-ts-${hex.slice(0, 16)}`);
    const a = shortIdKey('pod-sandbox-0000000001');
    const b = shortIdKey('pod-sandbox-0000000002');
    expect(a).toMatch(/^[0-9a-f]{16}$/);
    expect(a).not.toBe(b);
    expect(netnsNameFor('pod-sandbox-0000000001')).toMatch(/^kata-ts-[0-9a-f]{16}$/);
  });
});
