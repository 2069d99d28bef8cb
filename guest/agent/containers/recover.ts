import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { errnoCode } from '../../../src/common/errors.js';
import { parseStatusLine, type WaitStatus } from './reaper.js';
import type { ContainerStatus } from './types.js';

/** What the agent keeps in each bundle (`agent.json`) so that a restarted agent knows it again. */
export interface BundleRecord {
  createdAtMs: number;
  startedAtMs?: number;
  cgroup?: string;
  writableLayerPath?: string;
}

export const BUNDLE_RECORD = 'agent.json';
export const INIT_PID_FILE = 'init.pid';

export async function writeBundleRecord(bundle: string, record: BundleRecord): Promise<void> {
  await writeFile(path.join(bundle, BUNDLE_RECORD), JSON.stringify(record));
}

/** The reaper's `<pid file>.exit` ("exit N" / "signal N"), or undefined while the process runs. */
export async function readExitFile(pidFile: string): Promise<{ status: WaitStatus; finishedAtMs: number } | undefined> {
  const file = `${pidFile}.exit`;
  try {
    const [text, st] = await Promise.all([readFile(file, 'utf8'), stat(file)]);
    const { event, value } = parseStatusLine(text.trim());
    const n = Number(value);
    if (event === 'exit') return { status: { kind: 'exit', code: n }, finishedAtMs: st.mtimeMs };
    if (event === 'signal') return { status: { kind: 'signal', signal: n }, finishedAtMs: st.mtimeMs };
    return undefined;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

/** Resolves once the reaper wrote the exit file (checked every `intervalMs`; the timer is unref'd). */
export function pollExitFile(pidFile: string, intervalMs: number): Promise<{ status: WaitStatus; finishedAtMs: number }> {
  return new Promise((resolve, reject) => {
    const check = () => {
      readExitFile(pidFile).then((found) => {
        if (found) resolve(found);
        else setTimeout(check, intervalMs).unref();
      }, reject);
    };
    check();
  });
}

export interface FoundBundle {
  id: string;
  bundle: string;
  pid: number;
  record: BundleRecord;
}

/** Bundles under `bundlesDir` that reached `crun create` (they have a pid and a record). */
export async function findBundles(bundlesDir: string): Promise<FoundBundle[]> {
  const names = await readdir(bundlesDir).catch((err: unknown) => {
    if (errnoCode(err) === 'ENOENT') return [] as string[];
    throw err;
  });
  const found: FoundBundle[] = [];
  for (const id of names) {
    const bundle = path.join(bundlesDir, id);
    try {
      const pid = Number((await readFile(path.join(bundle, INIT_PID_FILE), 'utf8')).trim());
      const record = JSON.parse(await readFile(path.join(bundle, BUNDLE_RECORD), 'utf8')) as BundleRecord;
      if (pid > 0) found.push({ id, bundle, pid, record });
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw err;
    }
  }
  return found;
}

/** crun's `status` field as ours (`paused` counts as running). */
export function runtimeStatus(stateJson: string): ContainerStatus {
  const status = (JSON.parse(stateJson) as { status?: string }).status;
  if (status === 'created') return 'created';
  if (status === 'stopped') return 'stopped';
  return 'running';
}
