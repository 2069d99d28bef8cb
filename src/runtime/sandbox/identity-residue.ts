/**
 * What an identity (a uid = gid a confined QEMU ran as) may leave behind that the next pod given
 * the same number would inherit: live processes (a QEMU helper that outlived its VM, a process
 * forked before the kill) and SysV IPC objects (shared memory, message queues and semaphores
 * survive their creator). Read from /proc, whose root is a parameter so tests can pass a tree.
 *
 * SysV IPC is per IPC namespace: /proc/sysvipc shows the reader's. Objects made in an IPC
 * namespace of QEMU's own die with that namespace, so the runtime's view is the one that matters.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode } from '../../common/errors.js';

/** One thing of an id still on the host, for a log line and a test's assertion. */
export interface ResidueItem {
  kind: 'process' | 'shm' | 'msg' | 'sem';
  /** The pid (process) or the IPC object's id (shmid, msqid, semid). */
  id: number;
}

/** Every id that still has something on the host, with what it has. */
export type UidResidue = Map<number, ResidueItem[]>;

const IPC_KINDS = ['shm', 'msg', 'sem'] as const;
/** The id column of each /proc/sysvipc table, and the owner columns read from each. */
const IPC_ID_COLUMN: Record<(typeof IPC_KINDS)[number], string> = { shm: 'shmid', msg: 'msqid', sem: 'semid' };
const IPC_OWNER_COLUMNS = ['uid', 'gid', 'cuid', 'cgid'];
/** /proc/<pid>/status files read at once. */
const STATUS_BATCH = 64;

function add(residue: UidResidue, owner: number, item: ResidueItem): void {
  const list = residue.get(owner);
  if (list === undefined) residue.set(owner, [item]);
  else if (!list.some((i) => i.kind === item.kind && i.id === item.id)) list.push(item);
}

/**
 * The ids of a /proc/<pid>/status: real, effective, saved and filesystem uid and gid (an identity
 * is used as both, and a process holding any of them can act as it). Pure.
 */
export function statusIds(status: string): number[] {
  const ids: number[] = [];
  for (const line of status.split('\n')) {
    if (!line.startsWith('Uid:') && !line.startsWith('Gid:')) continue;
    for (const field of line.slice(4).trim().split(/\s+/)) if (/^[0-9]+$/.test(field)) ids.push(Number(field));
  }
  return ids;
}

/**
 * The owners of each object of one /proc/sysvipc table (`kind`): its uid, gid, creator uid and
 * creator gid, found by the header's column names (their positions differ between tables). Pure.
 */
export function sysvipcOwners(table: string, kind: (typeof IPC_KINDS)[number]): Array<{ id: number; owners: number[] }> {
  const lines = table.split('\n').filter((l) => l.trim() !== '');
  const header = lines[0]?.trim().split(/\s+/) ?? [];
  const idAt = header.indexOf(IPC_ID_COLUMN[kind]);
  const ownerAt = IPC_OWNER_COLUMNS.map((c) => header.indexOf(c)).filter((i) => i >= 0);
  if (idAt < 0 || ownerAt.length === 0) return [];
  return lines.slice(1).map((line) => {
    const f = line.trim().split(/\s+/);
    return { id: Number(f[idAt]), owners: ownerAt.map((i) => Number(f[i])).filter((n) => Number.isSafeInteger(n)) };
  });
}

async function readOrEmpty(file: string): Promise<string> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch (err) {
    // A process that exited while we looked, or a kernel without SysV IPC: nothing of it left.
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ESRCH') return '';
    throw err;
  }
}

/**
 * Everything of ids in [firstId, lastId] left on the host: processes from every /proc/<pid>/status,
 * IPC objects from /proc/sysvipc/{shm,msg,sem}. One pass for the whole range, so an allocation
 * checks every candidate against one snapshot. A process can only gain a uid in the range from a
 * process already holding it (or root, which is the runtime), so a snapshot cannot miss a newcomer.
 */
export async function readUidResidue(procRoot: string, firstId: number, lastId: number): Promise<UidResidue> {
  const residue: UidResidue = new Map();
  const inRange = (id: number) => id >= firstId && id <= lastId;
  const pids = (await fsp.readdir(procRoot)).filter((name) => /^[0-9]+$/.test(name));
  // Read in batches: one status at a time costs a RunPodSandbox ~0.2 ms per host process.
  for (let i = 0; i < pids.length; i += STATUS_BATCH) {
    const batch = pids.slice(i, i + STATUS_BATCH);
    const texts = await Promise.all(batch.map((pid) => readOrEmpty(path.join(procRoot, pid, 'status'))));
    texts.forEach((text, j) => {
      for (const id of statusIds(text)) if (inRange(id)) add(residue, id, { kind: 'process', id: Number(batch[j]) });
    });
  }
  for (const kind of IPC_KINDS) {
    for (const obj of sysvipcOwners(await readOrEmpty(path.join(procRoot, 'sysvipc', kind)), kind)) {
      for (const owner of obj.owners) if (inRange(owner)) add(residue, owner, { kind, id: obj.id });
    }
  }
  return residue;
}
