/**
 * The pod's network inside the guest (ConfigureNetwork): the NIC the host planned, found by the MAC
 * it shares with the pod's CNI interface, gets that interface's MTU and addresses, then the routes
 * and /etc/resolv.conf follow. Containers share the guest's network namespace, so this is the
 * pod's network for all of them (localhost between containers is the guest's loopback).
 * Done with busybox `ip` (argument arrays, never a shell).
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { invalid, notFound } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import type { ConfigureNetworkRequest, ConfigureNetworkResponse } from '../../src/generated/agent/agent.js';

export interface GuestNetworkPaths {
  ip: string;
  sysClassNet: string;
  resolvConf: string;
}

export const GUEST_NETWORK_PATHS: GuestNetworkPaths = { ip: '/bin/ip', sysClassNet: '/sys/class/net', resolvConf: '/etc/resolv.conf' };

const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const CIDR = /^[0-9a-fA-F.:]+\/\d{1,3}$/;
const ADDRESS = /^[0-9a-fA-F.:]+$/;
const DNS_WORD = /^[^\s#;]+$/;
/** How long the NIC may take to appear (the virtio_net module is loaded at boot, before the agent). */
const NIC_WAIT_MS = 5000;

function run(file: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: 10_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${path.basename(file)} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
  });
}

/** Pure: the checks ConfigureNetwork makes before it changes anything; the field named on failure. */
export function validateNetworkRequest(req: ConfigureNetworkRequest): void {
  req.interfaces.forEach((iface, i) => {
    if (!MAC.test(iface.mac))
      throw invalid('NETWORK_REQUEST_INVALID', `interfaces[${i}].mac ${JSON.stringify(iface.mac)} is not a MAC address.`);
    if (iface.mtu !== 0 && (iface.mtu < 68 || iface.mtu > 65535))
      throw invalid('NETWORK_REQUEST_INVALID', `interfaces[${i}].mtu ${iface.mtu} is out of range.`);
    iface.addresses.forEach((a, j) => {
      if (!CIDR.test(a))
        throw invalid('NETWORK_REQUEST_INVALID', `interfaces[${i}].addresses[${j}] ${JSON.stringify(a)} is not a CIDR address.`);
    });
  });
  req.routes.forEach((r, i) => {
    if (!CIDR.test(r.destination))
      throw invalid('NETWORK_REQUEST_INVALID', `routes[${i}].destination ${JSON.stringify(r.destination)} is not a CIDR.`);
    if (r.gateway !== '' && !ADDRESS.test(r.gateway))
      throw invalid('NETWORK_REQUEST_INVALID', `routes[${i}].gateway ${JSON.stringify(r.gateway)} is not an address.`);
  });
  for (const [field, words] of [
    ['dns_servers', req.dnsServers],
    ['dns_searches', req.dnsSearches],
    ['dns_options', req.dnsOptions],
  ] as const) {
    words.forEach((w, i) => {
      if (!DNS_WORD.test(w))
        throw invalid('NETWORK_REQUEST_INVALID', `${field}[${i}] ${JSON.stringify(w)} cannot be one resolv.conf word.`);
    });
  }
}

/** Pure: resolv.conf's text, or undefined when there is nothing to say. */
export function resolvConfText(req: Pick<ConfigureNetworkRequest, 'dnsServers' | 'dnsSearches' | 'dnsOptions'>): string | undefined {
  const lines = req.dnsServers.map((s) => `nameserver ${s}`);
  if (req.dnsSearches.length > 0) lines.push(`search ${req.dnsSearches.join(' ')}`);
  if (req.dnsOptions.length > 0) lines.push(`options ${req.dnsOptions.join(' ')}`);
  return lines.length === 0 ? undefined : `${lines.join('\n')}\n`;
}

export class GuestNetwork {
  constructor(
    private readonly logger: Logger,
    private readonly paths: GuestNetworkPaths = GUEST_NETWORK_PATHS,
  ) {}

  async configure(req: ConfigureNetworkRequest): Promise<ConfigureNetworkResponse> {
    validateNetworkRequest(req);
    const ip = this.paths.ip;
    await run(ip, ['link', 'set', 'dev', 'lo', 'up']);
    const names: string[] = [];
    for (const iface of req.interfaces) {
      const name = await this.waitForNic(iface.mac);
      if (iface.mtu !== 0) await run(ip, ['link', 'set', 'dev', name, 'mtu', String(iface.mtu)]);
      // Global addresses only: an IPv6 link-local address (neighbour discovery needs it) stays.
      await run(ip, ['addr', 'flush', 'dev', name, 'scope', 'global']);
      for (const a of iface.addresses) await run(ip, [...(a.includes(':') ? ['-6'] : []), 'addr', 'add', a, 'dev', name]);
      await run(ip, ['link', 'set', 'dev', name, 'up']);
      names.push(name);
    }
    const dev = names[0];
    for (const r of req.routes) {
      const family = r.destination.includes(':') ? ['-6'] : [];
      const via = r.gateway === '' ? [] : ['via', r.gateway];
      await run(ip, [...family, 'route', 'replace', r.destination, ...via, ...(dev === undefined ? [] : ['dev', dev])]);
    }
    const resolv = resolvConfText(req);
    if (resolv !== undefined) await fsp.writeFile(this.paths.resolvConf, resolv, { mode: 0o644 });
    this.logger.info({ interfaces: names, routes: req.routes.length, dns: resolv !== undefined }, 'pod network configured');
    return { interfaceNames: names };
  }

  /** The guest's name of the NIC with `mac`. */
  private async waitForNic(mac: string): Promise<string> {
    const deadline = Date.now() + NIC_WAIT_MS;
    for (;;) {
      for (const name of await fsp.readdir(this.paths.sysClassNet).catch(() => [] as string[])) {
        const addr = await fsp.readFile(path.join(this.paths.sysClassNet, name, 'address'), 'utf8').catch(() => '');
        if (addr.trim().toLowerCase() === mac) return name;
      }
      if (Date.now() > deadline) throw notFound('NETWORK_NIC_NOT_FOUND', `no network interface with MAC ${mac} in the guest.`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
