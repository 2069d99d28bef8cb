/**
 * Runs a scenario next to a real, confined `systemd --user` (see README.md in this directory and
 * /work/shared/ENVIRONMENT.md): private cgroups first (under this process's own cgroup in every
 * hierarchy), the launching shell moved in and verified, then new cgroup/mount/pid namespaces in
 * which the hierarchies, /run/systemd, a private session bus and the user manager are set up and
 * the scenario runs. Afterwards the private cgroup tree is removed deepest first and PID 1's
 * cgroups are checked to be exactly what they were.
 */
import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type CgroupMount, parseProcCgroup } from '../../../src/cgroups/procfs.js';
import { createPrivateCgroups, removePrivateCgroups } from '../../helpers/cgroups-private.js';

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
    throw new HarnessRefused(
      `PID 1 is not at the root cgroup (${bad.map((e) => `${e.controllers.join(',')}:${e.path}`).join(' ')}); refusing to run systemd.`,
    );
  }
  return text;
}

/** How to mount a hierarchy again inside the namespaces: fstype and -o options ('-' for none). */
function mountOptions(m: CgroupMount): string {
  if (m.fsType === 'cgroup2') return '-';
  const named = m.controllers.filter((c) => c.startsWith('name='));
  const real = m.controllers.filter((c) => !c.startsWith('name='));
  return real.length > 0 ? [...real, ...named].join(',') : ['none', ...named].join(',');
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
  const pc = await createPrivateCgroups();
  const name = pc.name;
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), `${name}-`));
  let run: Omit<HarnessRun<T>, 'pid1After' | 'leftoverCgroups' | 'leftoverProcesses' | 'pid1Before'> | undefined;
  try {
    // What /proc/self/cgroup must show once the shell has moved: every line with the private name appended.
    const expectedLines = own.map((e) => `${e.hierarchyId}:${e.controllers.join(',')}:${path.posix.join(e.path, name)}`);
    const inodes: string[] = [];
    for (const h of pc.hierarchies) inodes.push(`${h.name} ${(await fsp.stat(h.dir)).ino}`);
    const resultFile = path.join(work, 'result.json');
    const child = spawn('bash', [path.join(HERE, 'confine.sh')], {
      cwd: REPO,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        ...opts.env,
        KATA_TS_PRIVATE_DIRS: pc.hierarchies.map((h) => h.dir).join('\n'),
        KATA_TS_EXPECTED_CGROUP: opts.expectedCgroupOverride ?? expectedLines.join('\n'),
        KATA_TS_HARNESS_DIR: HERE,
        KATA_TS_CGROUP_MOUNTS: pc.hierarchies.map((h) => `${h.name} ${h.mount.fsType} ${mountOptions(h.mount)}`).join('\n'),
        KATA_TS_PRIVATE_INODES: inodes.join('\n'),
        KATA_TS_WORK_DIR: work,
        KATA_TS_SCENARIO: opts.scenario,
        KATA_TS_REPO: REPO,
        KATA_TS_RESULT: resultFile,
      },
    });
    // Should this process exit early, do not leave the confined tree running (SIGKILL to the
    // shell's exec'd unshare makes it SIGKILL the namespace's init, which takes everything along).
    const killOnExit = () => child.kill('SIGKILL');
    process.once('exit', killOnExit);
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stderr += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 180_000);
    const [exitCode, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.on('exit', (code, sig) => resolve([code, sig])),
    );
    clearTimeout(timer);
    process.off('exit', killOnExit);
    const resultText = await readText(resultFile).catch(() => undefined);
    run = {
      exitCode,
      signal,
      stderr,
      result: resultText === undefined ? undefined : (JSON.parse(resultText) as T),
      systemdLog: await readText(path.join(work, 'systemd.log')).catch(() => ''),
      systemdStarted: await fsp.stat(path.join(work, 'systemd.pid')).then(
        () => true,
        () => false,
      ),
    };
  } finally {
    // The pid namespace's init has exited, so the kernel has killed everything inside; a process
    // still in the private tree would mean the confinement leaked.
    const leftoverProcesses = await processesInCgroupsNamed(name);
    const leftovers = await removePrivateCgroups(pc);
    await fsp.rm(work, { recursive: true, force: true });
    const pid1After = await readText('/proc/1/cgroup');
    if (run !== undefined) Object.assign(run, { pid1Before, pid1After, leftoverCgroups: leftovers, leftoverProcesses });
    if (pid1After !== pid1Before) {
      // Loud on purpose: this is the one thing that must never happen.
      const message = `PID 1's cgroups changed during the systemd harness run:\nbefore:\n${pid1Before}\nafter:\n${pid1After}`;
      console.error(`!!! ${message}`);
      // biome-ignore lint/correctness/noUnsafeFinally: a changed PID 1 must win over any other outcome of the run.
      throw new Error(message);
    }
  }
  return run as HarnessRun<T>;
}
