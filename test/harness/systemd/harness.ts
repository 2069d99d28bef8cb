/**
 * Runs a scenario next to a real, confined `systemd --user` (see README.md in this directory and
 * /work/shared/ENVIRONMENT.md): private cgroups first (under this process's own cgroup in every
 * hierarchy), the launching shell moved in and verified, then new cgroup/mount/pid namespaces in
 * which the hierarchies, /run/systemd, a private session bus and the user manager are set up and
 * the scenario runs. Afterwards the private cgroup tree is removed deepest first and PID 1's
 * cgroups are checked to be exactly what they were.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { cgroupDirOf, parseCgroupMounts, parseProcCgroup, type CgroupMount } from '../../../src/cgroups/procfs.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '../../..');

export interface HarnessRun<T> {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
  /** What the scenario wrote to $KATA_TS_RESULT (undefined when it wrote nothing). */
  result: T | undefined;
  systemdLog: string;
  /** Whether inner.sh got as far as starting systemd (it writes systemd.pid). */
  systemdStarted: boolean;
  /** /proc/1/cgroup before and after: must be equal, all at '/'. */
  pid1Before: string;
  pid1After: string;
  /** Private cgroup directories still present after teardown (must be none). */
  leftoverCgroups: string[];
  /** Processes anywhere on the machine still in a cgroup below the private one, after the run. */
  leftoverProcesses: string[];
}

export class HarnessRefused extends Error {}

async function readText(file: string): Promise<string> {
  return fsp.readFile(file, 'utf8');
}

/** Refuses to go on unless PID 1 sits at the root of every hierarchy, as on these machines. */
export async function assertPid1AtRoot(): Promise<string> {
  const text = await readText('/proc/1/cgroup');
  const bad = parseProcCgroup(text).filter((e) => e.path !== '/');
  if (bad.length > 0) {
    throw new HarnessRefused(`PID 1 is not at the root cgroup (${bad.map((e) => `${e.controllers.join(',')}:${e.path}`).join(' ')}); refusing to run systemd.`);
  }
  return text;
}

/** The hierarchies mounted under /sys/fs/cgroup, with how to mount each again inside. */
function mountSpecs(mounts: CgroupMount[]): { name: string; mount: CgroupMount; fsType: string; options: string }[] {
  return mounts
    .filter((m) => path.dirname(m.mountPoint) === '/sys/fs/cgroup')
    .map((m) => {
      const named = m.controllers.filter((c) => c.startsWith('name='));
      const real = m.controllers.filter((c) => !c.startsWith('name='));
      const options = m.fsType === 'cgroup2' ? '-' : real.length > 0 ? [...real, ...named].join(',') : ['none', ...named].join(',');
      return { name: path.basename(m.mountPoint), mount: m, fsType: m.fsType, options };
    });
}

/** `pid: cgroup line` of every process whose cgroups mention `name` (scans /proc). */
export async function processesInCgroupsNamed(name: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await fsp.readdir('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const text = await readText(`/proc/${entry}/cgroup`).catch(() => '');
    const line = text.split('\n').find((l) => l.includes(`/${name}`));
    if (line !== undefined) out.push(`${entry}: ${line}`);
  }
  return out;
}

/** Every directory below `dir`, deepest first, then `dir` itself. */
async function treeDeepestFirst(dir: string): Promise<string[]> {
  const out: string[] = [];
  const entries = await fsp.readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) if (e.isDirectory()) out.push(...(await treeDeepestFirst(path.join(dir, e.name))));
  out.push(dir);
  return out;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Removes a private cgroup tree deepest first; processes still inside are ours (they live in it) and are killed by pid. */
export async function removePrivateTree(root: string): Promise<string[]> {
  if (!path.basename(root).startsWith('kata-ts-test-')) throw new HarnessRefused(`refusing to remove ${root}: not a kata-ts-test-* cgroup`);
  for (let attempt = 0; attempt < 100; attempt++) {
    if ((await fsp.stat(root).catch(() => null)) === null) return [];
    const dirs = await treeDeepestFirst(root);
    let busy = false;
    for (const dir of dirs) {
      try {
        await fsp.rmdir(dir);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') continue;
        busy = true;
        if (attempt >= 40) {
          const procs = (await readText(path.join(dir, 'cgroup.procs')).catch(() => '')).split('\n').filter((p) => p !== '');
          for (const pid of procs) {
            try {
              process.kill(Number(pid), 'SIGKILL');
            } catch {
              /* already gone */
            }
          }
        }
      }
    }
    if (!busy) return [];
    await sleep(50);
  }
  const left: string[] = [];
  for (const d of await treeDeepestFirst(root)) if ((await fsp.stat(d).catch(() => null)) !== null) left.push(d);
  return left;
}

export interface HarnessOptions {
  /** Scenario file, relative to the repository root. */
  scenario: string;
  /** Extra environment for the scenario. */
  env?: Record<string, string>;
  timeoutMs?: number;
  /**
   * For the refusal test only: the /proc/self/cgroup the shell is told to expect, instead of the
   * private cgroups it really joins, so that it must refuse before any namespace or systemd.
   */
  expectedCgroupOverride?: string;
}

export async function runConfinedSystemd<T>(opts: HarnessOptions): Promise<HarnessRun<T>> {
  const pid1Before = await assertPid1AtRoot();
  const own = parseProcCgroup(await readText('/proc/self/cgroup'));
  const specs = mountSpecs(parseCgroupMounts(await readText('/proc/self/mountinfo')));
  const name = `kata-ts-test-${randomBytes(6).toString('hex')}`;
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), `${name}-`));
  const privateRoots: string[] = [];
  const expectedLines: string[] = [];
  const inodes: string[] = [];
  let run: Omit<HarnessRun<T>, 'pid1After' | 'leftoverCgroups' | 'leftoverProcesses' | 'pid1Before'> | undefined;
  try {
    for (const spec of specs) {
      const entry = own.find((e) =>
        spec.mount.fsType === 'cgroup2'
          ? e.hierarchyId === 0
          : e.controllers.length === spec.mount.controllers.length && e.controllers.every((c) => spec.mount.controllers.includes(c)),
      );
      if (entry === undefined) throw new HarnessRefused(`no /proc/self/cgroup entry for ${spec.name}`);
      const ownDir = cgroupDirOf([spec.mount], entry);
      if (ownDir === undefined) throw new HarnessRefused(`own cgroup of ${spec.name} is not visible at ${spec.mount.mountPoint}`);
      const dir = path.join(ownDir, name);
      await fsp.mkdir(dir);
      privateRoots.push(dir);
      if (spec.mount.controllers.includes('cpuset')) {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) await fsp.writeFile(path.join(dir, f), (await readText(path.join(ownDir, f))).trim());
      }
      inodes.push(`${spec.name} ${(await fsp.stat(dir)).ino}`);
    }
    for (const e of own) expectedLines.push(`${e.hierarchyId}:${e.controllers.join(',')}:${path.posix.join(e.path, name)}`);
    const resultFile = path.join(work, 'result.json');
    const child = spawn('bash', [path.join(HERE, 'confine.sh')], {
      cwd: REPO,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        ...opts.env,
        KATA_TS_PRIVATE_DIRS: privateRoots.join('\n'),
        KATA_TS_EXPECTED_CGROUP: opts.expectedCgroupOverride ?? expectedLines.join('\n'),
        KATA_TS_HARNESS_DIR: HERE,
        KATA_TS_CGROUP_MOUNTS: specs.map((s) => `${s.name} ${s.fsType} ${s.options}`).join('\n'),
        KATA_TS_PRIVATE_INODES: inodes.join('\n'),
        KATA_TS_WORK_DIR: work,
        KATA_TS_SCENARIO: opts.scenario,
        KATA_TS_REPO: REPO,
        KATA_TS_RESULT: resultFile,
      },
    });
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stderr += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 180_000);
    const [exitCode, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.on('exit', (code, sig) => resolve([code, sig])),
    );
    clearTimeout(timer);
    const resultText = await readText(resultFile).catch(() => undefined);
    run = {
      exitCode,
      signal,
      stderr,
      result: resultText === undefined ? undefined : (JSON.parse(resultText) as T),
      systemdLog: await readText(path.join(work, 'systemd.log')).catch(() => ''),
      systemdStarted: await fsp.stat(path.join(work, 'systemd.pid')).then(() => true, () => false),
    };
  } finally {
    // The pid namespace's init has exited, so the kernel has killed everything inside; a process
    // still in the private tree would mean the confinement leaked.
    const leftoverProcesses = await processesInCgroupsNamed(name);
    const leftovers: string[] = [];
    for (const root of privateRoots) leftovers.push(...(await removePrivateTree(root)));
    await fsp.rm(work, { recursive: true, force: true });
    const pid1After = await readText('/proc/1/cgroup');
    if (pid1After !== pid1Before) {
      // Loud on purpose: this is the one thing that must never happen.
      console.error(`!!! PID 1's cgroups changed during the systemd harness run:\nbefore:\n${pid1Before}\nafter:\n${pid1After}`);
    }
    if (run !== undefined) Object.assign(run, { pid1Before, pid1After, leftoverCgroups: leftovers, leftoverProcesses });
  }
  return run as HarnessRun<T>;
}
