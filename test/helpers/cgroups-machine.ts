/**
 * Machine-level checks shared by the cgroup integration tests: PID 1 untouched, no test cgroup
 * and no process in one left behind. Read-only. Other runs (other engineers, other test files)
 * make `kata-ts-test-*` cgroups on the same machine at the same time: a test judges only the
 * private trees it made itself (createPrivateCgroups keeps their names).
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { privateCgroupNamesMade } from './cgroups-private.js';

const CGROUP_MOUNT_ROOT = '/sys/fs/cgroup';
const TEST_PREFIX = 'kata-ts-test-';

async function walk(dir: string, depth: number, out: string[]): Promise<void> {
  if (depth < 0) return;
  const entries = await fsp.readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) {
    if (!e.isDirectory()) continue;
    const child = path.join(dir, e.name);
    if (e.name.startsWith(TEST_PREFIX)) out.push(child);
    else await walk(child, depth - 1, out);
  }
}

/** Every `kata-ts-test-*` cgroup directory on the machine named in `own` (searched a few levels deep). */
export async function kataTestCgroupsOnMachine(own: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const h of await fsp.readdir(CGROUP_MOUNT_ROOT)) await walk(path.join(CGROUP_MOUNT_ROOT, h), 5, out);
  return out.filter((d) => own.includes(path.basename(d)));
}

/** `pid: line` of processes whose cgroups lie below a kata-ts-test-* cgroup named in `own`. */
export async function processesInTestCgroups(own: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await fsp.readdir('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const text = await fsp.readFile(`/proc/${entry}/cgroup`, 'utf8').catch(() => '');
    const line = text.split('\n').find((l) => own.some((name) => l.includes(`/${name}/`) || l.endsWith(`/${name}`)));
    if (line === undefined) continue;
    // A zombie is no process left running: it has exited and released everything but its pid,
    // and waits for its parent to reap it. A VMM whose daemon a test SIGKILLed is reparented to
    // PID 1, which reaps it in its own time (its cgroup, already removed, shows as "(deleted)").
    const stat = await fsp.readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    if (stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) === 'Z') continue;
    out.push(`${entry}: ${line}`);
  }
  return out;
}

/** PID 1 at '/' in every hierarchy (these machines' control plane), as text lines that are not. */
export async function pid1OffRoot(): Promise<string[]> {
  const text = await fsp.readFile('/proc/1/cgroup', 'utf8');
  return text.split('\n').filter((l) => l !== '' && !l.endsWith(':/'));
}

/**
 * Throws, listing everything out of place, unless the machine is as the tests found it: PID 1 at
 * the root, and nothing left of the private trees `own` (by default every one this process made).
 */
export async function assertMachineClean(own: readonly string[] = privateCgroupNamesMade()): Promise<void> {
  const problems = [
    ...(await pid1OffRoot()).map((l) => `PID 1 not at the root: ${l}`),
    ...(await kataTestCgroupsOnMachine(own)).map((d) => `test cgroup left: ${d}`),
    ...(await processesInTestCgroups(own)).map((p) => `process left in a test cgroup: ${p}`),
  ];
  if (problems.length > 0) throw new Error(`machine not left as found:\n${problems.join('\n')}`);
}
