/**
 * A network namespace the caller made and attached (the shim face: containerd made it and ran CNI
 * ADD in it before asking for the pod): found, checked and read here, never made, changed or
 * deleted here. The VM joins it with the same TAP + tc mirred wiring as a namespace of our own
 * (wiring.ts, done and undone by PodNetworks), and the guest is told what `eth0` holds.
 *
 * iproute2's `-n NAME` takes only a name in its namespace directory, so a path in `/run/netns`
 * (or `/var/run/netns`, usually a symlink to it) is used by name; a namespace anywhere else
 * (`/proc/<pid>/ns/net`, a runtime's own directory) is entered with `nsenter --net=PATH` for each
 * command, as QEMU is. Reads only.
 *
 * The path is the caller's, and stays so in the record: where the runtime's mount namespace does
 * not see the caller's bind mount (a private root), it is opened through the caller's root
 * (src/common/caller-root.ts `callerPath`), here and wherever the record's namespace is entered.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { callerPath } from '../common/caller-root.js';
import { errnoCode, invalid, precondition } from '../common/errors.js';
import { parseIpAddr, parseIpJson, parseIpRoutes } from './ip-json.js';
import type { JoinedPodNetworkRecord } from './record.js';
import { inNetns, NETNS_DIR, type NetnsRef, POD_IF_NAME, POD_TAP_NAME, run } from './wiring.js';
import './reasons.js';

/** The statfs type of nsfs, the file system of namespace files (linux/magic.h NSFS_MAGIC). */
const NSFS_MAGIC = 0x6e736673;
/** Where iproute2 keeps named namespaces, as callers spell it. */
const NETNS_DIRS = new Set([NETNS_DIR, '/var/run/netns']);

/** The request's field the caller named the namespace in (named in every refusal). */
const FIELD = 'joinNetns';

/**
 * The name iproute2's `-n` would take for `netnsPath` (its directory is /run/netns or
 * /var/run/netns), or null (entered by path). Refuses anything but an absolute, normalised path. Pure.
 */
export function joinedNetnsName(netnsPath: string): string | null {
  const normal = path.posix.isAbsolute(netnsPath) && path.posix.normalize(netnsPath) === netnsPath && !netnsPath.endsWith('/');
  if (!normal || netnsPath.includes('\0')) {
    throw invalid('JOIN_NETNS_INVALID', `${FIELD} ${JSON.stringify(netnsPath)} is not an absolute, normalised path.`, {
      details: { field: FIELD, [FIELD]: netnsPath },
    });
  }
  return NETNS_DIRS.has(path.posix.dirname(netnsPath)) ? path.posix.basename(netnsPath) : null;
}

/**
 * Check the caller's namespace and read what its `eth0` holds, changing nothing: it must exist,
 * be a namespace file (nsfs) that enters as a network namespace, and have `eth0` with a MAC, an
 * MTU and at least one global address. FAILED_PRECONDITION naming the path otherwise.
 */
export async function readJoinedNetwork(netnsPath: string): Promise<JoinedPodNetworkRecord> {
  let netnsName = joinedNetnsName(netnsPath);
  const details = { field: FIELD, [FIELD]: netnsPath };
  // The caller's path, opened in the caller's mount namespace when ours does not see the same file.
  const openable = callerPath(netnsPath);
  let fsType: number;
  try {
    fsType = (await fsp.statfs(openable)).type;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') {
      throw precondition('JOIN_NETNS_MISSING', `${FIELD} ${netnsPath} does not exist.`, { details });
    }
    throw precondition('JOIN_NETNS_NOT_NETNS', `${FIELD} ${netnsPath} cannot be read.`, { cause: err, details });
  }
  if (fsType !== NSFS_MAGIC) {
    throw precondition('JOIN_NETNS_NOT_NETNS', `${FIELD} ${netnsPath} is not a namespace file (nsfs).`, { details });
  }
  // `ip -n NAME` opens NETNS_DIR/NAME: by name only when that is this very namespace.
  if (netnsName !== null && !(await sameFile(path.posix.join(NETNS_DIR, netnsName), openable))) netnsName = null;
  const ns: NetnsRef = netnsName ?? { path: openable };
  let addrText: string;
  try {
    addrText = await run(inNetns(ns, 'ip', ['-j', 'addr', 'show']), 'NETNS_FAILED');
  } catch (err) {
    throw precondition('JOIN_NETNS_NOT_NETNS', `${FIELD} ${netnsPath} cannot be entered as a network namespace.`, { cause: err, details });
  }
  const link = parseIpAddr(parseIpJson(addrText, 'ip addr show'), POD_IF_NAME);
  if (link === undefined) {
    throw precondition('JOIN_NETNS_NO_INTERFACE', `${FIELD} ${netnsPath} has no interface ${POD_IF_NAME}.`, { details });
  }
  if (link.ips.length === 0) {
    throw precondition('JOIN_NETNS_NO_ADDRESS', `${POD_IF_NAME} in ${FIELD} ${netnsPath} has no global address.`, { details });
  }
  const [routes4, routes6] = await Promise.all([
    run(inNetns(ns, 'ip', ['-j', 'route', 'show']), 'NETNS_FAILED'),
    run(inNetns(ns, 'ip', ['-j', '-6', 'route', 'show']), 'NETNS_FAILED'),
  ]);
  return {
    kind: 'joined',
    netnsName,
    netnsPath,
    ifName: POD_IF_NAME,
    tapName: POD_TAP_NAME,
    result: {
      ips: link.ips,
      routes: parseIpRoutes(parseIpJson(routes4, 'ip route show'), parseIpJson(routes6, 'ip -6 route show'), POD_IF_NAME),
      // A namespace holds no DNS: the guest's resolv.conf comes from the spec's DNS config.
      dns: { servers: [], searches: [], options: [] },
    },
    mac: link.mac,
    mtu: link.mtu,
    tapWired: false,
  };
}

async function sameFile(a: string, b: string): Promise<boolean> {
  try {
    const [sa, sb] = await Promise.all([fsp.stat(a, { bigint: true }), fsp.stat(b, { bigint: true })]);
    return sa.dev === sb.dev && sa.ino === sb.ino;
  } catch {
    return false;
  }
}
