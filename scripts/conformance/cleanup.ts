/**
 * Removes everything one conformance run made, given its work directory: every process whose
 * command line names the directory (critest, the daemon, the registry, QEMU, virtiofsd: all were
 * started by the run and point into it), the private cgroup tree whose name the run wrote to
 * `<work>/cgroup-name`, and the directory itself. Idempotent, so the driver's `finally` and the
 * shell script's trap may both call it.
 *
 *   node --import tsx scripts/conformance/cleanup.ts <work dir>
 */
import { spawnSync } from 'node:child_process';
import { promises as fsp, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { TEST_CGROUP_PREFIX } from '../../test/helpers/cgroups-private.js';
import { cgroupDirsUnder } from '../../test/helpers/runtime-daemon.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Pids (other than this process and its parent) whose command line contains `needle`. */
function pidsMentioning(needle: string): number[] {
  const skip = new Set([process.pid, process.ppid]);
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || skip.has(Number(entry))) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(needle)) out.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

async function killAll(needle: string): Promise<void> {
  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    const pids = pidsMentioning(needle);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, signal);
      } catch {
        // gone
      }
    }
    for (let i = 0; i < 50 && pidsMentioning(needle).length > 0; i++) await sleep(100);
  }
}

/** Removes `<hierarchy>/<own cgroup>/<name>` trees (deepest first); processes inside are ours and are killed. */
async function removeCgroups(name: string): Promise<string[]> {
  if (!name.startsWith(TEST_CGROUP_PREFIX) || name.includes('/')) throw new Error(`refusing to remove cgroup ${name}`);
  const own = readFileSync('/proc/self/cgroup', 'utf8');
  const tops = new Set<string>();
  for (const line of own.split('\n').filter((l) => l !== '')) {
    const cgPath = line.split(':').slice(2).join(':');
    tops.add(path.posix.join(cgPath, name));
  }
  let left: string[] = [];
  for (let attempt = 0; attempt < 60; attempt++) {
    left = [];
    for (const top of tops) left.push(...(await cgroupDirsUnder(top)));
    if (left.length === 0) return [];
    for (const dir of left) {
      const procs = (await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter((p) => p !== '');
      for (const pid of procs) {
        try {
          process.kill(Number(pid), 'SIGKILL'); // only this run's VMMs were ever placed here
        } catch {
          // gone
        }
      }
      await fsp.rmdir(dir).catch(() => undefined);
    }
    await sleep(100);
  }
  return left;
}

/**
 * Mount points under `work` in this mount namespace, deepest first: critest's mount-propagation
 * specs bind-mount their temp dirs (inside the run's private mount namespace) and a failing spec
 * leaves them mounted. Fields of /proc/self/mountinfo escape spaces as \040.
 */
function mountsUnder(work: string): string[] {
  const points = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => (l.split(' ')[4] ?? '').replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8))))
    .filter((p) => p.startsWith(`${work}/`));
  return [...new Set(points)].sort((a, b) => b.length - a.length);
}

/**
 * The network namespaces this run's daemon made (/run/netns/kata-ts-<16 hex>), named by the
 * records it left: pooled VMs outlive a daemon stop by design, and a pod critest failed to remove
 * keeps its own. Their names live in the host's /run/netns even when the mounts were private.
 */
async function netnsOfRecords(stateDir: string): Promise<string[]> {
  const names = new Set<string>();
  for (const sub of ['pool', 'sandboxes']) {
    const dir = path.join(stateDir, sub);
    for (const file of await fsp.readdir(dir).catch(() => [] as string[])) {
      if (!file.endsWith('.json')) continue;
      const doc = JSON.parse(await fsp.readFile(path.join(dir, file), 'utf8').catch(() => '{}')) as {
        record?: { network?: { netnsName?: unknown } | null };
      };
      const name = doc.record?.network?.netnsName;
      if (typeof name === 'string' && /^kata-ts-[0-9a-f]{16}$/.test(name)) names.add(name);
    }
  }
  return [...names];
}

/** Everything under `work` goes; returns what could not be removed (cgroup dirs). */
export async function cleanupRun(work: string): Promise<string[]> {
  if (!path.isAbsolute(work) || !path.basename(work).startsWith('ktc-'))
    throw new Error(`refusing to clean ${work}: not a conformance work dir`);
  await killAll(work);
  for (const point of mountsUnder(work)) spawnSync('umount', ['-l', point], { stdio: 'ignore' });
  for (const name of await netnsOfRecords(path.join(work, 'state'))) {
    const file = path.join('/run/netns', name);
    spawnSync('umount', ['-l', file], { stdio: 'ignore' });
    await fsp.rm(file, { force: true });
  }
  const name = (await fsp.readFile(path.join(work, 'cgroup-name'), 'utf8').catch(() => '')).trim();
  const left = name === '' ? [] : await removeCgroups(name);
  await fsp.rm(work, { recursive: true, force: true });
  return left;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const work = process.argv[2];
  if (work === undefined) {
    process.stderr.write('usage: cleanup.ts <work dir>\n');
    process.exit(2);
  }
  const left = await cleanupRun(work);
  if (left.length > 0) {
    process.stderr.write(`conformance cleanup: could not remove cgroups:\n  ${left.join('\n  ')}\n`);
    process.exit(1);
  }
}
