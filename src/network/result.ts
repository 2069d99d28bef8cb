/**
 * What a CNI ADD returned, reduced to what the pod needs: its addresses (the pod IPs), routes and
 * DNS, for the guest's interface. Pure.
 */
import { invalid } from '../common/errors.js';
import './reasons.js';

export interface PodIp {
  /** Without the prefix length. */
  address: string;
  prefixLength: number;
  family: 4 | 6;
  gateway?: string;
}

export interface PodRoute {
  /** CIDR, e.g. `0.0.0.0/0`. */
  destination: string;
  gateway?: string;
}

export interface PodDns {
  servers: string[];
  searches: string[];
  options: string[];
}

export interface PodNetworkResult {
  ips: PodIp[];
  routes: PodRoute[];
  dns: PodDns;
}

const IPV4_CIDR = /^(\d{1,3}(\.\d{1,3}){3})\/(\d{1,2})$/;
const IPV6_CIDR = /^([0-9a-fA-F:.]+)\/(\d{1,3})$/;
const IP = /^(\d{1,3}(\.\d{1,3}){3}|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)$/;

function fail(field: string, what: string): never {
  throw invalid('CNI_RESULT_INVALID', `CNI result ${field} ${what}.`);
}

function parseCidr(text: unknown, field: string): { address: string; prefixLength: number; family: 4 | 6 } {
  if (typeof text !== 'string') return fail(field, 'must be a CIDR string');
  const v4 = IPV4_CIDR.exec(text);
  if (v4 !== null && Number(v4[3]) <= 32) return { address: v4[1]!, prefixLength: Number(v4[3]), family: 4 };
  const v6 = IPV6_CIDR.exec(text);
  if (v6 !== null && v6[1]!.includes(':') && Number(v6[2]) <= 128) return { address: v6[1]!, prefixLength: Number(v6[2]), family: 6 };
  return fail(field, `is ${JSON.stringify(text)}, not an address with a prefix length`);
}

function strings(v: unknown, field: string): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.some((s) => typeof s !== 'string')) return fail(field, 'must be a list of strings');
  return v as string[];
}

/**
 * A CNI result (0.3.0 and later: `interfaces`, `ips`, `routes`, `dns`) -> the pod's addresses.
 * Only addresses of the container-side interface `ifName` (or of no named interface) count.
 */
export function parseCniResult(raw: unknown, ifName: string): PodNetworkResult {
  if (typeof raw !== 'object' || raw === null) return fail('', 'is not a JSON object');
  const r = raw as Record<string, unknown>;
  const interfaces = Array.isArray(r.interfaces) ? (r.interfaces as Array<Record<string, unknown>>) : [];
  const ips: PodIp[] = [];
  (Array.isArray(r.ips) ? (r.ips as Array<Record<string, unknown>>) : []).forEach((ip, i) => {
    const idx = ip.interface;
    if (typeof idx === 'number') {
      const iface = interfaces[idx];
      if (iface !== undefined && iface.name !== ifName) return;
    }
    const cidr = parseCidr(ip.address, `ips[${i}].address`);
    const gw = ip.gateway;
    if (gw !== undefined && (typeof gw !== 'string' || !IP.test(gw))) fail(`ips[${i}].gateway`, 'must be an IP address');
    ips.push({ ...cidr, ...(typeof gw === 'string' ? { gateway: gw } : {}) });
  });
  if (ips.length === 0) fail('ips', `holds no address for interface ${ifName}`);
  const routes = (Array.isArray(r.routes) ? (r.routes as Array<Record<string, unknown>>) : []).map((route, i): PodRoute => {
    parseCidr(route.dst, `routes[${i}].dst`);
    const gw = route.gw;
    if (gw !== undefined && (typeof gw !== 'string' || !IP.test(gw))) fail(`routes[${i}].gw`, 'must be an IP address');
    return { destination: route.dst as string, ...(typeof gw === 'string' ? { gateway: gw } : {}) };
  });
  const dns = (typeof r.dns === 'object' && r.dns !== null ? r.dns : {}) as Record<string, unknown>;
  const searches = strings(dns.search, 'dns.search');
  if (typeof dns.domain === 'string' && dns.domain !== '' && !searches.includes(dns.domain)) searches.unshift(dns.domain);
  return {
    ips,
    routes,
    dns: { servers: strings(dns.nameservers, 'dns.nameservers'), searches, options: strings(dns.options, 'dns.options') },
  };
}

/** The pod's primary IP first (IPv4 before IPv6, as the kubelet orders them), then the rest. */
export function podIps(result: PodNetworkResult): string[] {
  return [...result.ips.filter((ip) => ip.family === 4), ...result.ips.filter((ip) => ip.family === 6)].map((ip) => ip.address);
}
