/**
 * What the Task service must know of a pod's tasks to serve them again after its process died
 * (node mode: the node shim server is revived by the pod's relay and re-attaches the pod, whose
 * VM and containers kept running): one small JSON file per task in `<podStateDir>/tasks/`,
 * written at Create, updated at Start, removed at Delete. The core's own records (sandbox,
 * containers) say the rest; exec'd processes are not kept (an exec in flight when the server
 * died is lost, its caller sees its connection end).
 *
 * The files are the shim's own (root, 0600, in its state dir), read back with their shape checked.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import type { TaskIo } from './stdio.js';

/** The directory of the task files in the pod's state dir. */
export const TASK_RECORD_DIR = 'tasks';

/** One task as the Task service made it. */
export interface TaskRecordFile {
  id: string;
  kind: 'sandbox' | 'container';
  bundle: string;
  io: TaskIo;
  rootfsMounted: boolean;
  crio: boolean;
  solo: boolean;
  started: boolean;
  /** Node mode: the pid of the process holding the container's output FIFOs open (node-output-holder.ts); absent or 0: none. */
  outputHolderPid?: number;
}

function fileOf(stateDir: string, id: string): string {
  return path.join(stateDir, TASK_RECORD_DIR, `${id}.json`);
}

/** Write (or rewrite) the task's file. */
export async function writeTaskRecord(stateDir: string, record: TaskRecordFile): Promise<void> {
  await fsp.mkdir(path.join(stateDir, TASK_RECORD_DIR), { recursive: true, mode: 0o700 });
  await writeFileAtomic(fileOf(stateDir, record.id), `${JSON.stringify(record)}\n`);
}

/** Remove the task's file (none: nothing to do). */
export async function removeTaskRecord(stateDir: string, id: string): Promise<void> {
  await fsp.rm(fileOf(stateDir, id), { force: true });
}

function isTaskIo(v: unknown): v is TaskIo {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  return typeof o.stdin === 'string' && typeof o.stdout === 'string' && typeof o.stderr === 'string' && typeof o.terminal === 'boolean';
}

function isTaskRecord(v: unknown): v is TaskRecordFile {
  if (typeof v !== 'object' || v === null) return false;
  const o = v as Record<string, unknown>;
  return (
    typeof o.id === 'string' &&
    (o.kind === 'sandbox' || o.kind === 'container') &&
    typeof o.bundle === 'string' &&
    isTaskIo(o.io) &&
    typeof o.rootfsMounted === 'boolean' &&
    typeof o.crio === 'boolean' &&
    typeof o.solo === 'boolean' &&
    typeof o.started === 'boolean' &&
    (o.outputHolderPid === undefined ||
      (typeof o.outputHolderPid === 'number' && Number.isInteger(o.outputHolderPid) && o.outputHolderPid >= 0))
  );
}

/** Every task file of the pod that reads as one (the sandbox's first); `bad` lists the others. */
export async function readTaskRecords(stateDir: string): Promise<{ records: TaskRecordFile[]; bad: string[] }> {
  let names: string[];
  try {
    names = await fsp.readdir(path.join(stateDir, TASK_RECORD_DIR));
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return { records: [], bad: [] };
    throw err;
  }
  const records: TaskRecordFile[] = [];
  const bad: string[] = [];
  for (const name of names.filter((n) => n.endsWith('.json')).sort()) {
    const parsed = await fsp
      .readFile(path.join(stateDir, TASK_RECORD_DIR, name), 'utf8')
      .then((t) => JSON.parse(t) as unknown)
      .catch(() => undefined);
    if (isTaskRecord(parsed) && `${parsed.id}.json` === name) records.push(parsed);
    else bad.push(name);
  }
  records.sort((a, b) => (a.kind === b.kind ? 0 : a.kind === 'sandbox' ? -1 : 1));
  return { records, bad };
}
