/**
 * The log writer's resume record: one small JSON document per container, replaced atomically
 * after each batch is appended. It says how far the container's output is stored: every byte
 * below `committedOffset` is either in a log file (up to `fileSizeBytes` of the file
 * `fileDev`/`fileIno`) or in `pendingBase64` (the partial lines the formatter still holds).
 */
import { precondition } from '../../common/errors.js';
import { readFileIfExists, writeFileAtomic } from '../../common/fsutil.js';
import { compileOnce, describeSchemaErrors } from '../../common/schema.js';
import type { PendingLines } from './format.js';

export const LOG_STATE_VERSION = 1;

/** The record as stored. Sizes and offsets are bytes; numbers stay below 2^53. */
export interface LogStateRecord {
  version: 1;
  /** The first output offset not yet stored: where StreamOutput resumes. */
  committedOffset: number;
  /** Identity (decimal dev and inode: 64-bit) and size of the log file as of the last batch; '0' before any file was opened. */
  fileDev: string;
  fileIno: string;
  fileSizeBytes: number;
  pendingBase64: { stdout: string; stderr: string };
  /** The output reached end of file and everything is in the log. */
  eof: boolean;
}

const validate = compileOnce<LogStateRecord>({
  type: 'object',
  additionalProperties: false,
  required: ['version', 'committedOffset', 'fileDev', 'fileIno', 'fileSizeBytes', 'pendingBase64', 'eof'],
  properties: {
    version: { const: LOG_STATE_VERSION },
    committedOffset: { type: 'integer', minimum: 0 },
    fileDev: { type: 'string', pattern: '^[0-9]+$' },
    fileIno: { type: 'string', pattern: '^[0-9]+$' },
    fileSizeBytes: { type: 'integer', minimum: 0 },
    pendingBase64: {
      type: 'object',
      additionalProperties: false,
      required: ['stdout', 'stderr'],
      properties: { stdout: { type: 'string' }, stderr: { type: 'string' } },
    },
    eof: { type: 'boolean' },
  },
});

/** The state of a container whose output was never stored. */
export function freshLogState(): LogStateRecord {
  return {
    version: 1,
    committedOffset: 0,
    fileDev: '0',
    fileIno: '0',
    fileSizeBytes: 0,
    pendingBase64: { stdout: '', stderr: '' },
    eof: false,
  };
}

export function encodePending(p: PendingLines): LogStateRecord['pendingBase64'] {
  return { stdout: Buffer.from(p.stdout).toString('base64'), stderr: Buffer.from(p.stderr).toString('base64') };
}

export function decodePending(p: LogStateRecord['pendingBase64']): PendingLines {
  return { stdout: Buffer.from(p.stdout, 'base64'), stderr: Buffer.from(p.stderr, 'base64') };
}

/** Read the record at `file`; a missing file is a fresh state, an invalid one an error. */
export async function readLogState(file: string): Promise<LogStateRecord> {
  const text = await readFileIfExists(file);
  if (text === undefined) return freshLogState();
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw precondition('LOGS_STATE_CORRUPT', `log state ${file} is not JSON.`, { cause: err });
  }
  if (!validate()(doc)) {
    throw precondition('LOGS_STATE_CORRUPT', `log state ${file} is invalid: ${describeSchemaErrors(validate().errors).join('; ')}.`);
  }
  return doc;
}

/** Replace the record at `file` (temp, fsync, rename, fsync dir): a crash leaves old or new. */
export async function writeLogState(file: string, state: LogStateRecord): Promise<void> {
  await writeFileAtomic(file, `${JSON.stringify(state)}\n`);
}
