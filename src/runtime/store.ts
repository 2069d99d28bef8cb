import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { ValidateFunction } from 'ajv';
import { errnoCode, errorMessage, invalid } from '../common/errors.js';
import { writeFileAtomic } from '../common/fsutil.js';
import type { Logger } from '../common/logger.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';

/** One kind of persisted record: where its files live and what a valid one looks like. */
export interface RecordKind {
  /** `sandbox`, `container`: written into every file so a misplaced file is recognised. */
  kind: string;
  /** Sub-directory of the state dir holding one `<id>.json` per record. */
  dir: string;
  /** Current format version; files with another version are not loaded (see load()). */
  version: number;
  /** JSON Schema of the record itself (the envelope is checked here). */
  schema: object;
  /**
   * Turn a record written by an older format version into the current one (pure; throws when it
   * cannot). Without it, older versions are set aside like corrupt files.
   */
  migrate?(fromVersion: number, record: unknown): unknown;
}

/** A file that could not be loaded, reported to the operator instead of crashing or vanishing. */
export interface RecordProblem {
  file: string;
  problem: string;
  /** Where the file was moved, or null when it was left in place (newer format). */
  setAsideTo: string | null;
}

interface Envelope {
  kind: string;
  version: number;
  record: unknown;
}

const ID_FILE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json$/;

/**
 * Versioned JSON records, one file per object, written atomically (temp, fsync, rename).
 *
 * Loading never throws for a bad file: a corrupt or invalid record is moved to `<dir>/corrupt/`
 * and reported; a record written by a newer format version is left in place and reported, so a
 * downgrade never destroys state it cannot read.
 */
export class RecordStore<T extends { id: string }> {
  private readonly dir: string;
  private readonly validate: () => ValidateFunction<T>;

  constructor(
    stateDir: string,
    private readonly kind: RecordKind,
    private readonly logger: Logger,
  ) {
    this.dir = path.join(stateDir, kind.dir);
    this.validate = compileOnce<T>(kind.schema);
  }

  /** The directory the records live in. */
  get directory(): string {
    return this.dir;
  }

  async init(): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  private fileFor(id: string): string {
    if (!ID_FILE.test(`${id}.json`)) throw invalid('STORE_BAD_ID', `record id "${id}" is not a valid file name`);
    return path.join(this.dir, `${id}.json`);
  }

  /** Persist a record atomically; a crash leaves either the previous version or this one. */
  async put(record: T): Promise<void> {
    const validate = this.validate();
    if (!validate(record)) {
      // A record we are about to write must be valid: anything else is a bug, caught here
      // rather than at the next start when it would be set aside.
      throw new Error(`refusing to persist an invalid ${this.kind.kind} record: ${describeSchemaErrors(validate.errors).join('; ')}`);
    }
    const envelope: Envelope = { kind: this.kind.kind, version: this.kind.version, record };
    await writeFileAtomic(this.fileFor(record.id), `${JSON.stringify(envelope, null, 2)}\n`);
  }

  /** Remove a record; removing one that does not exist is fine. */
  async delete(id: string): Promise<void> {
    await fsp.rm(this.fileFor(id), { force: true });
  }

  /** Load every record, setting aside what cannot be used. */
  async load(): Promise<{ records: T[]; problems: RecordProblem[] }> {
    await this.init();
    const records: T[] = [];
    const problems: RecordProblem[] = [];
    const names = (await fsp.readdir(this.dir)).sort();
    for (const name of names) {
      const file = path.join(this.dir, name);
      if (name.startsWith('.') && name.endsWith('.tmp')) {
        // Left by a crash between write and rename: the previous version is still intact.
        await fsp.rm(file, { force: true });
        continue;
      }
      if (!name.endsWith('.json')) continue;
      const outcome = await this.loadOne(file, name);
      if ('record' in outcome) records.push(outcome.record);
      else problems.push(outcome.problem);
    }
    for (const p of problems) {
      this.logger.error({ file: p.file, problem: p.problem, setAsideTo: p.setAsideTo }, `${this.kind.kind} record not loaded`);
    }
    return { records, problems };
  }

  private async loadOne(file: string, name: string): Promise<{ record: T } | { problem: RecordProblem }> {
    let envelope: Envelope;
    try {
      envelope = JSON.parse(await fsp.readFile(file, 'utf8')) as Envelope;
    } catch (err) {
      return { problem: await this.setAside(file, `unreadable JSON: ${errorMessage(err)}`) };
    }
    if (typeof envelope !== 'object' || envelope === null || envelope.kind !== this.kind.kind) {
      return { problem: await this.setAside(file, `not a ${this.kind.kind} record`) };
    }
    let migrated = false;
    if (envelope.version !== this.kind.version) {
      if (typeof envelope.version === 'number' && envelope.version > this.kind.version) {
        return {
          problem: {
            file,
            problem: `written by a newer kata-ts (format ${envelope.version}, this one reads ${this.kind.version}); left in place`,
            setAsideTo: null,
          },
        };
      }
      const from = envelope.version;
      if (this.kind.migrate === undefined || typeof from !== 'number' || !Number.isInteger(from) || from < 1) {
        return { problem: await this.setAside(file, `unsupported format version ${String(from)}`) };
      }
      try {
        envelope = { ...envelope, version: this.kind.version, record: this.kind.migrate(from, envelope.record) };
        migrated = true;
      } catch (err) {
        return { problem: await this.setAside(file, `format ${from} could not be migrated: ${errorMessage(err)}`) };
      }
    }
    const validate = this.validate();
    if (!validate(envelope.record)) {
      return { problem: await this.setAside(file, describeSchemaErrors(validate.errors).join('; ')) };
    }
    const record = envelope.record;
    if (`${record.id}.json` !== name) {
      return { problem: await this.setAside(file, `record id ${record.id} does not match its file name`) };
    }
    if (migrated) {
      // Written back at once, so the state converges on one format; if that fails the record is
      // still used, and migrated again at the next start.
      try {
        await this.put(record);
        this.logger.info({ file, kind: this.kind.kind, version: this.kind.version }, `${this.kind.kind} record migrated`);
      } catch (err) {
        this.logger.warn({ file, err: errorMessage(err) }, `${this.kind.kind} record migrated in memory but not written back`);
      }
    }
    return { record };
  }

  private async setAside(file: string, problem: string): Promise<RecordProblem> {
    const corruptDir = path.join(this.dir, 'corrupt');
    await fsp.mkdir(corruptDir, { recursive: true, mode: 0o700 });
    const target = path.join(corruptDir, `${path.basename(file)}.${Date.now()}`);
    try {
      await fsp.rename(file, target);
      return { file, problem, setAsideTo: target };
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return { file, problem, setAsideTo: null };
      throw err;
    }
  }
}
