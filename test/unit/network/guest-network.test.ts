import { describe, expect, it } from 'vitest';
import { resolvConfText, validateNetworkRequest } from '../../../guest/agent/network.js';
import type { ConfigureNetworkRequest } from '../../../src/generated/agent/agent.js';
import { thrown } from '../../helpers/kata-error.js';

const REQ: ConfigureNetworkRequest = {
  interfaces: [{ mac: '0a:58:0a:2a:00:05', mtu: 1450, addresses: ['10.42.0.5/24'] }],
  routes: [{ destination: '0.0.0.0/0', gateway: '10.42.0.1' }],
  dnsServers: ['10.96.0.10'],
  dnsSearches: ['svc.cluster.local'],
  dnsOptions: ['ndots:5'],
};

describe('the guest side of ConfigureNetwork', () => {
  it('writes resolv.conf from the three lists, nothing when all are empty', () => {
    expect(resolvConfText(REQ)).toBe('nameserver 10.96.0.10\nsearch svc.cluster.local\noptions ndots:5\n');
    expect(resolvConfText({ dnsServers: [], dnsSearches: [], dnsOptions: [] })).toBeUndefined();
  });
  it('accepts a well-formed request and refuses bad fields by name', () => {
    validateNetworkRequest(REQ);
    const bad = (patch: Partial<ConfigureNetworkRequest>, field: RegExp): void => {
      const err = thrown(() => validateNetworkRequest({ ...REQ, ...patch }));
      expect(err.reason).toBe('NETWORK_REQUEST_INVALID');
      expect(err.message).toMatch(field);
    };
    bad({ interfaces: [{ mac: 'nope', mtu: 1500, addresses: [] }] }, /interfaces\[0\]\.mac/);
    bad({ interfaces: [{ mac: '0a:58:0a:2a:00:05', mtu: 1500, addresses: ['10.0.0.1'] }] }, /addresses\[0\]/);
    bad({ routes: [{ destination: '0.0.0.0/0', gateway: '10.0.0.1; rm' }] }, /routes\[0\]\.gateway/);
    bad({ dnsOptions: ['a b'] }, /dns_options\[0\]/);
  });
});
