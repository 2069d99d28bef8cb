/**
 * What a joined namespace's interface holds, read from iproute2's JSON (`ip -j addr show`,
 * `ip -j route show`, `ip -j -6 route show`) into the shape CNI results give (PodNetworkResult),
 * so the guest is configured the same way whoever ran CNI. Pure.
 *
 * Only what the guest must be told is kept: the interface's global addresses (a link-local IPv6
 * address the guest makes itself) and the routes through it that someone added (a `kernel` route
 * is the one the kernel derives from an address: the guest's kernel derives it too). Each route
 * says its own gateway and none is put on the addresses, so a route without one (an on-link route
 * such as ptp's or Calico's `169.254.1.1 dev eth0 scope link`) stays on-link in the guest instead
 * of taking the family's gateway (what a CNI route without `gw` means). On-link routes come first,
 * since a gateway must be reachable when the route through it is added.
 */
import { internal } from '../common/errors.js';
import type { PodIp, PodRoute } from './result.js';
import './reasons.js';

/** The interface as `ip -j addr show` describes it. */
export interface IpLink {
  mac: string;
  mtu: number;
  ips: PodIp[];
}

function unreadable(what: string): never {
  throw internal('JOIN_NETNS_UNREADABLE', `iproute2's JSON ${what}.`);
}

/** iproute2's JSON output of `what` (an empty output is an empty list). */
export function parseIpJson(text: string, what: string): unknown {
  if (text.trim() === '') return [];
  try {
    return JSON.parse(text);
  } catch {
    return unreadable(`of \`${what}\` does not parse`);
  }
}

function list(json: unknown, what: string): Array<Record<string, unknown>> {
  if (!Array.isArray(json) || json.some((e) => typeof e !== 'object' || e === null)) return unreadable(`${what} is not a list of objects`);
  return json as Array<Record<string, unknown>>;
}

/**
 * `ifName` in `ip -j addr show` output: its MAC, MTU and global addresses (not those that failed
 * duplicate address detection); undefined when there is no such interface.
 */
export function parseIpAddr(json: unknown, ifName: string): IpLink | undefined {
  const link = list(json, 'of `ip addr show`').find((l) => l.ifname === ifName);
  if (link === undefined) return undefined;
  if (typeof link.address !== 'string' || typeof link.mtu !== 'number') unreadable(`of ${ifName} has no MAC or MTU`);
  const ips: PodIp[] = [];
  for (const a of list(link.addr_info ?? [], `addr_info of ${ifName}`)) {
    if (a.scope !== 'global' || a.dadfailed === true) continue;
    if (a.family !== 'inet' && a.family !== 'inet6') continue;
    if (typeof a.local !== 'string' || typeof a.prefixlen !== 'number') unreadable(`address of ${ifName} has no local or prefixlen`);
    ips.push({ address: a.local, prefixLength: a.prefixlen, family: a.family === 'inet' ? 4 : 6 });
  }
  return { mac: link.address, mtu: link.mtu, ips };
}

/** `dst` as ip -j prints it (`default`, `10.1.1.1`, `10.1.0.0/16`) -> a CIDR. */
function destination(dst: string, family: 4 | 6): string {
  if (dst === 'default') return family === 4 ? '0.0.0.0/0' : '::/0';
  return dst.includes('/') ? dst : `${dst}/${family === 4 ? 32 : 128}`;
}

/**
 * The routes through `ifName` in `ip -j route show` (IPv4) and `ip -j -6 route show` output that
 * the guest must be given (see the file's comment): unicast, not `kernel`, first of each
 * destination; a gateway marked `onlink` also gets an on-link route of its own. On-link first.
 */
export function parseIpRoutes(json4: unknown, json6: unknown, ifName: string): PodRoute[] {
  const onLink: PodRoute[] = [];
  const viaGateway: PodRoute[] = [];
  const seen = new Set<string>();
  const add = (route: PodRoute): void => {
    if (seen.has(route.destination)) return;
    seen.add(route.destination);
    (route.gateway === undefined ? onLink : viaGateway).push(route);
  };
  for (const [json, family] of [
    [json4, 4],
    [json6, 6],
  ] as const) {
    for (const r of list(json, `of \`ip -${family} route show\``)) {
      if (r.dev !== ifName || r.protocol === 'kernel') continue;
      // ip -j names the type only when it is not unicast (unreachable, blackhole, local, ...).
      if (r.type !== undefined && r.type !== 'unicast') continue;
      if (typeof r.dst !== 'string') unreadable(`route through ${ifName} has no dst`);
      const gateway = typeof r.gateway === 'string' ? r.gateway : undefined;
      if (gateway !== undefined && Array.isArray(r.flags) && r.flags.includes('onlink')) add({ destination: destination(gateway, family) });
      add({ destination: destination(r.dst, family), ...(gateway === undefined ? {} : { gateway }) });
    }
  }
  return [...onLink, ...viaGateway];
}
