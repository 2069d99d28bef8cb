/**
 * The pod's network namespace and the TAP that joins the VM's NIC to the CNI interface, Kata's
 * `tcfilter` model: an ingress qdisc on each of the CNI interface and the TAP, and a u32
 * match-all filter on each that redirects every frame (tc `mirred egress redirect`) to the other.
 * The CNI interface keeps its addresses and MAC for the CNI plugins' sake; the guest's NIC takes
 * the same MAC and the addresses, so for every peer the VM simply is the pod.
 *
 * Done with iproute2 (`ip`, `tc`) in argument arrays, never a shell. The command lists are
 * planned by pure functions (tested as such) and run in order.
 */
import { execFile } from 'node:child_process';
import { access } from 'node:fs/promises';
import { errnoCode, internal } from '../common/errors.js';
import { shortIdKey } from '../common/ids.js';
import './reasons.js';

/** Where `ip netns add` keeps named namespaces (fixed by iproute2). */
export const NETNS_DIR = '/run/netns';
/** The TAP's name inside the pod's namespace: one per namespace, so a constant. */
export const POD_TAP_NAME = 'tap0_kata';
/** The CNI interface's name inside the pod's namespace (CNI_IFNAME), as the kubelet's runtimes use. */
export const POD_IF_NAME = 'eth0';

/** The pod namespace's name: unique per sandbox (16 hex digits of the id, as its work dir: shortIdKey). */
export function netnsNameFor(sandboxId: string): string {
  return `kata-ts-${shortIdKey(sandboxId)}`;
}

/**
 * Where iproute2 runs: a namespace by its name in NETNS_DIR (`ip -n NAME`, `tc -n NAME`), or one
 * known only by a path elsewhere (a joined namespace: `/proc/<pid>/ns/net`, a runtime's own
 * directory), entered with `nsenter --net=PATH` (iproute2's `-n` takes only a name in its directory).
 */
export type NetnsRef = string | { path: string };

/** `tool args` run inside `ns`. Pure. */
export function inNetns(ns: NetnsRef, tool: 'ip' | 'tc', args: string[]): string[] {
  return typeof ns === 'string' ? [tool, '-n', ns, ...args] : ['nsenter', `--net=${ns.path}`, '--', tool, ...args];
}

/** What netnsNameFor makes, to tell a pod namespace among others in NETNS_DIR. */
export const POD_NETNS_NAME = /^kata-ts-[0-9a-f]{16}$/;

/** Who may attach to a TAP without CAP_NET_ADMIN: a confined QEMU's uid and gid. */
export interface TapOwner {
  uid: number;
  gid: number;
}

/** How PodNetworks.setup makes the TAP. */
export interface TapOptions {
  tapOwner?: TapOwner;
  /** The namespace exists already (a pooled VM's, made when the VM was booted; docs/pool.md): not created again. */
  netnsMade?: boolean;
}

/**
 * The argv lists that create the TAP (for `owner`, when given: its uid and gid may attach to it)
 * and redirect both ways between it and `ifName`.
 */
export function planTapWiring(netns: NetnsRef, ifName: string, tapName: string, mtu: number, owner?: TapOwner): string[][] {
  const redirect = (from: string, to: string): string[][] => [
    inNetns(netns, 'tc', ['qdisc', 'add', 'dev', from, 'ingress']),
    inNetns(netns, 'tc', [
      'filter',
      'add',
      'dev',
      from,
      'parent',
      'ffff:',
      'protocol',
      'all',
      'u32',
      'match',
      'u8',
      '0',
      '0',
      'action',
      'mirred',
      'egress',
      'redirect',
      'dev',
      to,
    ]),
  ];
  return [
    inNetns(netns, 'ip', [
      'tuntap',
      'add',
      'dev',
      tapName,
      'mode',
      'tap',
      ...(owner === undefined ? [] : ['user', String(owner.uid), 'group', String(owner.gid)]),
    ]),
    inNetns(netns, 'ip', ['link', 'set', 'dev', tapName, 'mtu', String(mtu), 'up']),
    ...redirect(ifName, tapName),
    ...redirect(tapName, ifName),
  ];
}

/**
 * The argv lists that undo the wiring: the filters and qdisc on the CNI interface, then the TAP
 * (its own qdisc goes with it). Each may find its object gone already; runAll(..., tolerant).
 */
export function planTapUnwiring(netns: NetnsRef, ifName: string, tapName: string): string[][] {
  return [inNetns(netns, 'tc', ['qdisc', 'del', 'dev', ifName, 'ingress']), inNetns(netns, 'ip', ['link', 'del', 'dev', tapName])];
}

/** Run one argv; stdout on success, a TAP_WIRING_FAILED / NETNS_FAILED error with stderr otherwise. */
export function run(argv: string[], reason: 'TAP_WIRING_FAILED' | 'NETNS_FAILED' = 'TAP_WIRING_FAILED'): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(argv[0]!, argv.slice(1), { timeout: 10_000 }, (err, stdout, stderr) => {
      if (err) reject(internal(reason, `${argv.join(' ')} failed: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
  });
}

/** Run the lists in order; `tolerant` collects failures instead of stopping (teardown). */
export async function runAll(lists: string[][], tolerant = false): Promise<string[]> {
  const failures: string[] = [];
  for (const argv of lists) {
    try {
      await run(argv);
    } catch (err) {
      if (!tolerant) throw err;
      failures.push((err as Error).message);
    }
  }
  return failures;
}

export async function createNetns(name: string): Promise<void> {
  await run(['ip', 'netns', 'add', name], 'NETNS_FAILED');
  // Loopback up, as every pod namespace has it (some plugins expect it; the loopback plugin may do it too).
  await run(['ip', '-n', name, 'link', 'set', 'dev', 'lo', 'up'], 'NETNS_FAILED');
}

export async function netnsExists(name: string): Promise<boolean> {
  try {
    await access(`${NETNS_DIR}/${name}`);
    return true;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return false;
    throw err;
  }
}

/** Remove the namespace's name (idempotent). The namespace itself ends with its last user (QEMU). */
export async function deleteNetns(name: string): Promise<void> {
  if (!(await netnsExists(name))) return;
  await run(['ip', 'netns', 'del', name], 'NETNS_FAILED');
}

/** MAC and MTU of an interface in the namespace (`ip -j link show`). */
export async function linkInfo(netns: NetnsRef, ifName: string): Promise<{ mac: string; mtu: number }> {
  const out = await run(inNetns(netns, 'ip', ['-j', 'link', 'show', 'dev', ifName]));
  const [link] = JSON.parse(out) as Array<{ address?: string; mtu?: number }>;
  if (link?.address === undefined || typeof link.mtu !== 'number') {
    throw internal('TAP_WIRING_FAILED', `interface ${ifName} in ${JSON.stringify(netns)} has no MAC or MTU: ${out.trim()}`);
  }
  return { mac: link.address, mtu: link.mtu };
}
