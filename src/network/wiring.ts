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
import './reasons.js';

/** Where `ip netns add` keeps named namespaces (fixed by iproute2). */
export const NETNS_DIR = '/run/netns';
/** The TAP's name inside the pod's namespace: one per namespace, so a constant. */
export const POD_TAP_NAME = 'tap0_kata';
/** The CNI interface's name inside the pod's namespace (CNI_IFNAME), as the kubelet's runtimes use. */
export const POD_IF_NAME = 'eth0';

/** The pod namespace's name: unique per sandbox (the id's first 16 hex digits, as its work dir). */
export function netnsNameFor(sandboxId: string): string {
  return `kata-ts-${sandboxId.slice(0, 16)}`;
}

/** What netnsNameFor makes, to tell a pod namespace among others in NETNS_DIR. */
export const POD_NETNS_NAME = /^kata-ts-[0-9a-f]{16}$/;

/** The argv lists that create the TAP and redirect both ways between it and `ifName`. */
export function planTapWiring(netns: string, ifName: string, tapName: string, mtu: number): string[][] {
  const redirect = (from: string, to: string): string[][] => [
    ['tc', '-n', netns, 'qdisc', 'add', 'dev', from, 'ingress'],
    [
      'tc',
      '-n',
      netns,
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
    ],
  ];
  return [
    ['ip', '-n', netns, 'tuntap', 'add', 'dev', tapName, 'mode', 'tap'],
    ['ip', '-n', netns, 'link', 'set', 'dev', tapName, 'mtu', String(mtu), 'up'],
    ...redirect(ifName, tapName),
    ...redirect(tapName, ifName),
  ];
}

/**
 * The argv lists that undo the wiring: the filters and qdisc on the CNI interface, then the TAP
 * (its own qdisc goes with it). Each may find its object gone already; runAll(..., tolerant).
 */
export function planTapUnwiring(netns: string, ifName: string, tapName: string): string[][] {
  return [
    ['tc', '-n', netns, 'qdisc', 'del', 'dev', ifName, 'ingress'],
    ['ip', '-n', netns, 'link', 'del', 'dev', tapName],
  ];
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
export async function linkInfo(netns: string, ifName: string): Promise<{ mac: string; mtu: number }> {
  const out = await run(['ip', '-j', '-n', netns, 'link', 'show', 'dev', ifName]);
  const [link] = JSON.parse(out) as Array<{ address?: string; mtu?: number }>;
  if (link?.address === undefined || typeof link.mtu !== 'number') {
    throw internal('TAP_WIRING_FAILED', `interface ${ifName} in ${netns} has no MAC or MTU: ${out.trim()}`);
  }
  return { mac: link.address, mtu: link.mtu };
}
