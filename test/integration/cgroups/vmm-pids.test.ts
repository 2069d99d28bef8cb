/**
 * pids.max on the VMM's cgroup, proven by attack on real cgroups (v1 hybrid here: the pids
 * controller's own hierarchy): a process of the test, placed by the cgroupfs driver as a VMM would
 * be, forks as many children as it can; the kernel refuses the fork that would pass the planned
 * limit (EAGAIN), and nothing it made outlives the test. Everything happens inside a private tree
 * the test creates below its own cgroups and removes afterwards.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type CgroupDriver, createCgroupDriver, type PlacementRecord, vmmPidsMax } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { assertMachineClean } from '../../helpers/cgroups-machine.js';
import {
  createPrivateCgroups,
  killOwned,
  linkRoot,
  mkdirEverywhere,
  type PrivateCgroups,
  removePrivateCgroups,
} from '../../helpers/cgroups-private.js';

/**
 * The hostile "VMM" (perl: Debian's perl-base is essential, always there): one thread, waits for a line, then forks children (each sleeps) until a fork
 * fails or 200 succeed; prints how many it made and the errno, then ends them all by pid.
 */
const FORKER = `
use POSIX ();
<STDIN>;
my @kids;
my $errno = 0;
for (1 .. 200) {
  my $pid = fork();
  if (!defined $pid) { $errno = $! + 0; last; }
  if ($pid == 0) { sleep 60; POSIX::_exit(0); }
  push @kids, $pid;
}
$| = 1;
print scalar(@kids), " $errno\\n";
for my $k (@kids) { kill 9, $k; waitpid $k, 0; }
`;
const EAGAIN = 11;

let pc: PrivateCgroups;
let root: string;
let driver: CgroupDriver;
let owned: ChildProcess[];
let placed: PlacementRecord | undefined;

beforeEach(async () => {
  owned = [];
  placed = undefined;
  pc = await createPrivateCgroups();
  root = await linkRoot(pc);
  driver = createCgroupDriver('cgroupfs', { cgroupRoot: root, dbusAddress: null, logger: silentLogger() });
});

afterEach(async () => {
  for (const child of owned) await killOwned(child);
  if (placed !== undefined) await driver.remove(placed).catch(() => undefined);
  const left = await removePrivateCgroups(pc);
  await fsp.rm(root, { recursive: true, force: true });
  expect(left).toEqual([]);
});

afterAll(async () => {
  await assertMachineClean();
});

/** The forker started, moved (ours) into `<private>/home` in every hierarchy, waiting for its line. */
async function startForker(): Promise<ChildProcess> {
  await mkdirEverywhere(pc, 'home');
  const child = spawn('perl', ['-e', FORKER], { stdio: ['pipe', 'pipe', 'inherit'] });
  owned.push(child);
  if (child.pid === undefined) throw new Error('perl did not start');
  for (const h of pc.hierarchies) await fsp.writeFile(path.join(h.dir, 'home', 'cgroup.procs'), String(child.pid));
  return child;
}

/** Let the forker go; its report: children made, errno of the refused fork. */
async function unleash(child: ChildProcess): Promise<{ made: number; errno: number }> {
  let out = '';
  child.stdout!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise((r) => child.once('exit', r));
  child.stdin!.end('go\n');
  await exited;
  const [made, errno] = out.trim().split(' ').map(Number);
  return { made: made ?? -1, errno: errno ?? -1 };
}

describe('VMM cgroup pids.max (real cgroups, v1 hybrid pids controller)', () => {
  it('attack: a process placed as a VMM with pids.max = maxVcpus + margin cannot fork past it', async () => {
    const forker = await startForker();
    // A 2-vCPU VM with a (test-small) margin of 16 tasks: 18.
    const pidsMax = vmmPidsMax(2, 0, 16);
    expect(pidsMax).toBe(18);
    placed = await driver.place({
      sandboxId: 'ef'.repeat(32),
      cgroupParent: '/kubepods/podpids',
      pid: forker.pid!,
      limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 },
      pidsMax,
    });
    expect(placed.pidsMax).toBe(pidsMax);
    const pidsDir = placed.paths.pids;
    expect(pidsDir).toBeDefined();
    expect((await fsp.readFile(path.join(pidsDir!, 'pids.max'), 'utf8')).trim()).toBe(String(pidsMax));
    const report = await unleash(forker);
    // The forker itself is one task of the cgroup: 17 children, and the 18th fork refused.
    expect(report).toEqual({ made: pidsMax - 1, errno: EAGAIN });
    // The kernel counted the refusal in the VMM's cgroup.
    expect(await fsp.readFile(path.join(pidsDir!, 'pids.events'), 'utf8')).toMatch(/^max [1-9]/m);
  });

  it('without pidsMax the driver writes no limit of its own (the same forker makes all 200 children)', async () => {
    const forker = await startForker();
    placed = await driver.place({
      sandboxId: 'fe'.repeat(32),
      cgroupParent: '/kubepods/podnopids',
      pid: forker.pid!,
      limits: { cpuQuotaMillicores: 0, cpuRequestMillicores: 0, memoryLimitBytes: 0 },
    });
    expect(placed.pidsMax).toBeUndefined();
    expect((await fsp.readFile(path.join(placed.paths.pids!, 'pids.max'), 'utf8')).trim()).toBe('max');
    expect(await unleash(forker)).toEqual({ made: 200, errno: 0 });
  });
});
