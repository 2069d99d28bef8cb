/**
 * The containerd installer's planner (pure): a config's text, what it imports, the containerd
 * release and what an earlier install recorded -> the file changes that install (or uninstall)
 * the kata-ts runtime handlers, or a typed refusal. The executor (execute.ts) only carries a plan out.
 *
 * Where the handlers go:
 * - containerd 2.x with a version 3 config whose `imports` glob covers a directory: a drop-in file
 *   there (2.x merges an imported file's plugin tables into the main config's);
 * - otherwise an edit of config.toml: one marked block appended, everything else byte for byte,
 *   after a backup of the original. containerd 1.6 and 1.7 replace a whole plugin section with an
 *   imported file's, so a drop-in naming the CRI plugin would drop every other CRI setting there;
 * - no config file: one is created with the release's `version` and the handlers only.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import { invalid, type KataError, precondition } from '../common/errors.js';
import './reasons.js';
import { type ContainerdConfigDocument, parseContainerdConfig, sameTable, schemaOf } from './document.js';
import { BLOCK_BEGIN, BLOCK_END, handlerTable, KATA_TS_RUNTIMES, renderTables, type Sandboxer, tableName } from './handlers.js';
import { type ConfigSchema, type ContainerdVersion, formatVersion, requireSupported } from './version.js';

/** A file the installer created (the config or a drop-in): removed by uninstall if unchanged. */
export interface CreatedFile {
  path: string;
  change: 'created';
  sha256: string;
}
/** The config edited in place: the block appended, and the backup of the original. */
export interface EditedFile {
  path: string;
  change: 'edited';
  /** The file as install left it. */
  sha256: string;
  /** The original, kept at backupPath. */
  sha256Before: string;
  backupPath: string;
  /** Exactly the text appended (a newline first when the original did not end with one). */
  appended: string;
}

/** What an install did, persisted in the state file so that uninstall undoes exactly that. */
export interface InstallRecord {
  format: 1;
  configPath: string;
  containerdVersion: string;
  schema: ConfigSchema;
  method: 'drop-in' | 'edit' | 'create';
  /** The TOML tables written, e.g. `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts`. */
  tables: string[];
  files: Array<CreatedFile | EditedFile>;
  /** Directories install made (the drop-in directory), removed by uninstall when empty. */
  createdDirs: string[];
}

export type FileChange =
  | { op: 'mkdir'; path: string }
  | { op: 'write'; path: string; text: string; what: string; mode?: number }
  | { op: 'remove'; path: string; what: string }
  | { op: 'rmdir'; path: string };

export interface InstallPlan {
  verb: 'install' | 'uninstall';
  /** In order; empty when there is nothing to do. */
  changes: FileChange[];
  /** One line each: what is (or would be) changed, or why nothing is. */
  summary: string[];
  /** The state to persist (install), null for uninstall. */
  record: InstallRecord | null;
}

export interface InstallInput {
  configPath: string;
  /** The config's text; null when the file does not exist. */
  configText: string | null;
  /** The files the config's imports resolve to, in containerd's load order, with their text. */
  imported: Array<{ path: string; text: string }>;
  /** Which of the directories named by the config's import globs exist. */
  existingDirs: string[];
  version: ContainerdVersion;
  /** What an earlier install recorded (the state file), if any. */
  record: InstallRecord | null;
  statePath: string;
  backupPath: string;
  /** `--sandboxer`: what containerd 2.x's CRI plugin uses for our handlers (default podsandbox). */
  sandboxer?: Sandboxer;
}

export function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

const DROP_IN_NAME = 'kata-ts';

/** Where a drop-in goes: the first import glob whose file name has one `*` (e.g. `conf.d/*.toml` -> `conf.d/kata-ts.toml`). */
export function dropInTarget(configPath: string, imports: string[]): { dir: string; file: string } | null {
  for (const pattern of imports) {
    const abs = path.isAbsolute(pattern) ? path.normalize(pattern) : path.join(path.dirname(configPath), pattern);
    const dir = path.dirname(abs);
    const base = path.basename(abs);
    if (/[*?[\]]/.test(dir)) continue;
    if (base.split('*').length !== 2 || /[?[\]]/.test(base)) continue;
    return { dir, file: path.join(dir, base.replace('*', DROP_IN_NAME)) };
  }
  return null;
}

function schemaFor(doc: ContainerdConfigDocument | null, version: ContainerdVersion): ConfigSchema {
  const schemas = requireSupported(version);
  if (doc === null || doc.empty) return schemas[0]!;
  if (doc.version === null) {
    throw precondition(
      'CONTAINERD_CONFIG_VERSION_UNSUPPORTED',
      `${doc.path} has no \`version\` key (containerd's version 1 layout); set \`version = ${schemas[0]}\` and use that layout, then install again`,
    );
  }
  if (!(schemas as readonly number[]).includes(doc.version)) {
    throw precondition(
      'CONTAINERD_CONFIG_VERSION_UNSUPPORTED',
      `${doc.path}: \`version = ${doc.version}\` is not read by containerd ${formatVersion(version)}, which reads version ${schemas.join(' or ')}`,
    );
  }
  return doc.version as ConfigSchema;
}

/** Both handlers' tables as this release and schema expect them, by handler. */
function desiredTables(version: ContainerdVersion, schema: ConfigSchema, sandboxer: Sandboxer): Record<string, Record<string, unknown>> {
  return Object.fromEntries(KATA_TS_RUNTIMES.map((r) => [r.handler, handlerTable(version, schema, r.runtimeType, sandboxer)]));
}

/** Which of our handlers `docs` already define, and whether each as we would. */
function existingHandlers(
  docs: ContainerdConfigDocument[],
  version: ContainerdVersion,
  sandboxer: Sandboxer,
): Array<{ handler: string; file: string; table: string; same: boolean }> {
  const out: Array<{ handler: string; file: string; table: string; same: boolean }> = [];
  for (const doc of docs) {
    const schema = schemaOf(doc.version);
    const want = desiredTables(version, schema, sandboxer);
    for (const [handler, table] of Object.entries(doc.handlers)) {
      out.push({ handler, file: doc.path, table: tableName(schema, handler), same: sameTable(table, want[handler]) });
    }
  }
  return out;
}

function conflict(found: { file: string; table: string }): KataError {
  return precondition(
    'INSTALL_HANDLER_CONFLICT',
    `${found.file} already defines [${found.table}] differently, not written by kata-ts; remove or rename that table first`,
    { details: { file: found.file, table: found.table } },
  );
}

/** The result must parse and hold both handlers as written (a config whose tables cannot take ours is refused). */
function checkResult(
  file: string,
  text: string,
  version: ContainerdVersion,
  schema: ConfigSchema,
  sandboxer: Sandboxer,
  tableHint: string,
): void {
  let doc: ContainerdConfigDocument;
  try {
    doc = parseContainerdConfig(file, text);
  } catch (err) {
    throw precondition(
      'CONTAINERD_CONFIG_NOT_EXTENSIBLE',
      `${file} cannot take [${tableHint}] appended (its tables would no longer be valid TOML); add the handler tables by hand`,
      { cause: err },
    );
  }
  const want = desiredTables(version, schema, sandboxer);
  for (const { handler } of KATA_TS_RUNTIMES) {
    if (!sameTable(doc.handlers[handler], want[handler])) {
      throw precondition(
        'CONTAINERD_CONFIG_NOT_EXTENSIBLE',
        `${file}: [${tableName(schema, handler)}] would not read as written after appending; add the handler tables by hand`,
      );
    }
  }
}

/** Plan `kata-ts install --containerd`. Throws a KataError refusal; changes nothing itself. */
export function planInstall(input: InstallInput): InstallPlan {
  const { configPath, version } = input;
  requireSupported(version);
  const main = input.configText === null ? null : parseContainerdConfig(configPath, input.configText);
  const schema = schemaFor(main, version);
  const sandboxer = input.sandboxer ?? 'podsandbox';
  if (sandboxer === 'shim' && version.major < 2) {
    throw invalid(
      'INSTALL_SANDBOXER_UNSUPPORTED',
      `--sandboxer shim needs containerd 2.x (its CRI plugin's Sandbox API); containerd ${formatVersion(version)} runs every pod through a pause container: install without --sandboxer`,
    );
  }
  const imported = input.imported.map((f) => parseContainerdConfig(f.path, f.text));
  const docs = main === null ? imported : [main, ...imported];
  const found = existingHandlers(docs, version, sandboxer);
  const tables = KATA_TS_RUNTIMES.map((r) => tableName(schema, r.handler));

  if (input.record !== null) {
    // Installed before: nothing to do if our handlers still read as we wrote them.
    const ours = new Set(input.record.files.map((f) => f.path));
    const bad = found.find((f) => !f.same);
    if (bad !== undefined && !ours.has(bad.file)) throw conflict(bad);
    const present = new Set(found.filter((f) => f.same).map((f) => f.handler));
    if (KATA_TS_RUNTIMES.every((r) => present.has(r.handler)) && bad === undefined) {
      return {
        verb: 'install',
        changes: [],
        summary: [`already installed (${input.statePath}): ${input.record.files.map((f) => f.path).join(', ')}; nothing changed`],
        record: input.record,
      };
    }
    throw precondition(
      'INSTALL_STATE_STALE',
      `${input.statePath} records an install, but the handlers it wrote are no longer in ${configPath}'s configuration as written; run \`kata-ts uninstall --containerd\` first`,
    );
  }

  // containerd 1.x: an imported file naming the CRI plugin replaces the config's whole section.
  const hiding = version.major === 1 ? imported.find((d) => d.definesCriPlugin) : undefined;
  if (hiding !== undefined) {
    throw precondition(
      'CONTAINERD_CONFIG_NOT_EXTENSIBLE',
      `${hiding.path} (imported by ${configPath}) replaces the whole [plugins."io.containerd.grpc.v1.cri"] section on containerd 1.x, so handlers in ${configPath} would be ignored; add the handler tables to that file by hand`,
    );
  }
  const different = found.find((f) => !f.same);
  if (different !== undefined) throw conflict(different);
  if (found.length > 0) {
    const missing = KATA_TS_RUNTIMES.filter((r) => !found.some((f) => f.handler === r.handler));
    if (missing.length === 0) {
      return {
        verb: 'install',
        changes: [],
        summary: [
          `${found.map((f) => `[${f.table}] in ${f.file}`).join(' and ')} already configured as kata-ts would, not by kata-ts: nothing changed (uninstall will leave them)`,
        ],
        record: null,
      };
    }
    throw precondition(
      'INSTALL_HANDLER_CONFLICT',
      `${found[0]!.file} defines [${found[0]!.table}] but not [${tableName(schema, missing[0]!.handler)}]; kata-ts installs both or neither`,
    );
  }

  const record: InstallRecord = {
    format: 1,
    configPath,
    containerdVersion: formatVersion(version),
    schema,
    method: 'create',
    tables,
    files: [],
    createdDirs: [],
  };
  const state = (r: InstallRecord): FileChange => ({
    op: 'write',
    path: input.statePath,
    text: `${JSON.stringify(r, null, 2)}\n`,
    what: 'install record',
  });
  const tablesLine = tables.map((t) => `[${t}]`).join(', ');

  // containerd 2.x, version 3, imports a directory: a drop-in of our own.
  const target = version.major >= 2 && main !== null && schema === 3 ? dropInTarget(configPath, main.imports) : null;
  if (target !== null) {
    if (input.imported.some((f) => f.path === target.file)) {
      throw precondition(
        'INSTALL_FILE_EXISTS',
        `${target.file} exists and was not written by kata-ts; remove it or install by editing the config`,
      );
    }
    const text = [
      `# Imported by ${configPath} (${main!.imports.join(', ')}).`,
      BLOCK_BEGIN,
      'version = 3',
      '',
      renderTables(version, 3, sandboxer),
      BLOCK_END,
      '',
    ].join('\n');
    checkResult(target.file, text, version, 3, sandboxer, tables[0]!);
    const mkdir = input.existingDirs.includes(target.dir) ? [] : [target.dir];
    const r: InstallRecord = {
      ...record,
      method: 'drop-in',
      files: [{ path: target.file, change: 'created', sha256: sha256(text) }],
      createdDirs: mkdir,
    };
    return {
      verb: 'install',
      changes: [
        ...mkdir.map((d): FileChange => ({ op: 'mkdir', path: d })),
        state(r),
        { op: 'write', path: target.file, text, what: `drop-in with ${tablesLine}`, mode: 0o644 },
      ],
      summary: [
        ...mkdir.map((d) => `created directory ${d}`),
        `wrote drop-in ${target.file} (imported by ${configPath}): ${tablesLine}`,
        `recorded the install in ${input.statePath}`,
      ],
      record: r,
    };
  }

  if (input.configText === null) {
    const text = [BLOCK_BEGIN, `version = ${schema}`, '', renderTables(version, schema, sandboxer), BLOCK_END, ''].join('\n');
    checkResult(configPath, text, version, schema, sandboxer, tables[0]!);
    const r: InstallRecord = { ...record, method: 'create', files: [{ path: configPath, change: 'created', sha256: sha256(text) }] };
    return {
      verb: 'install',
      changes: [state(r), { op: 'write', path: configPath, text, what: `new config with ${tablesLine}`, mode: 0o644 }],
      summary: [`created ${configPath} (version ${schema}): ${tablesLine}`, `recorded the install in ${input.statePath}`],
      record: r,
    };
  }

  const before = input.configText;
  const lead = before === '' || before.endsWith('\n') ? '' : '\n';
  // An empty document has no `version` yet: containerd would read the tables as version 1's.
  const versionLine = main!.empty ? [`version = ${schema}`, ''] : [];
  const appended = `${lead}${[
    before === '' ? null : '',
    BLOCK_BEGIN,
    ...versionLine,
    renderTables(version, schema, sandboxer),
    BLOCK_END,
    '',
  ]
    .filter((x) => x !== null)
    .join('\n')}`;
  const after = before + appended;
  checkResult(configPath, after, version, schema, sandboxer, tables[0]!);
  const r: InstallRecord = {
    ...record,
    method: 'edit',
    files: [
      { path: configPath, change: 'edited', sha256: sha256(after), sha256Before: sha256(before), backupPath: input.backupPath, appended },
    ],
  };
  return {
    verb: 'install',
    changes: [
      { op: 'write', path: input.backupPath, text: before, what: `backup of ${configPath}` },
      state(r),
      { op: 'write', path: configPath, text: after, what: `appended ${tablesLine}` },
    ],
    summary: [
      `backed up ${configPath} to ${input.backupPath}`,
      `appended to ${configPath} (version ${schema}, everything else unchanged): ${tablesLine}`,
      `recorded the install in ${input.statePath}`,
    ],
    record: r,
  };
}

export interface UninstallInput {
  statePath: string;
  record: InstallRecord | null;
  /** The current text of every file the record names (and of each edited file's backup); null when absent. */
  files: Record<string, string | null>;
}

/** Plan `kata-ts uninstall --containerd`: undo exactly what the record says install did. */
export function planUninstall(input: UninstallInput): InstallPlan {
  const { record } = input;
  if (record === null) {
    return { verb: 'uninstall', changes: [], summary: [`no install recorded at ${input.statePath}: nothing changed`], record: null };
  }
  const changes: FileChange[] = [];
  const summary: string[] = [];
  const removeLater: FileChange[] = [];
  for (const f of record.files) {
    const now = input.files[f.path] ?? null;
    if (f.change === 'created') {
      if (now === null) {
        summary.push(`${f.path} is already gone`);
      } else if (sha256(now) !== f.sha256) {
        throw precondition(
          'INSTALL_FILE_CHANGED',
          `${f.path} was changed since kata-ts created it; remove it by hand (and ${input.statePath})`,
        );
      } else {
        changes.push({ op: 'remove', path: f.path, what: 'file kata-ts created' });
        summary.push(`removed ${f.path} (${record.tables.map((t) => `[${t}]`).join(', ')})`);
      }
      continue;
    }
    const backup = input.files[f.backupPath] ?? null;
    if (now !== null && sha256(now) === f.sha256Before) {
      summary.push(`${f.path} already holds its original text`);
    } else if (now !== null && sha256(now) === f.sha256 && backup !== null && sha256(backup) === f.sha256Before) {
      // Untouched since install: the backup's bytes, exactly.
      changes.push({ op: 'write', path: f.path, text: backup, what: `restored from ${f.backupPath}` });
      summary.push(`restored ${f.path} from ${f.backupPath} (byte for byte as before install)`);
    } else if (now?.includes(f.appended)) {
      // Edited by someone else since: take out exactly our block, keep their change.
      const i = now.lastIndexOf(f.appended);
      changes.push({ op: 'write', path: f.path, text: now.slice(0, i) + now.slice(i + f.appended.length), what: 'kata-ts block removed' });
      summary.push(`removed kata-ts's block from ${f.path} (changed since install; other changes kept)`);
    } else {
      throw precondition(
        'INSTALL_FILE_CHANGED',
        `${f.path} no longer holds the block kata-ts appended (${record.tables.join(', ')}); restore it from ${f.backupPath} by hand`,
      );
    }
    if (backup !== null) {
      removeLater.push({ op: 'remove', path: f.backupPath, what: 'backup' });
      summary.push(`removed the backup ${f.backupPath}`);
    }
  }
  changes.push(...removeLater, { op: 'remove', path: input.statePath, what: 'install record' });
  summary.push(`removed the install record ${input.statePath}`);
  for (const d of [...record.createdDirs].reverse()) {
    changes.push({ op: 'rmdir', path: d });
    summary.push(`removed directory ${d} (if empty)`);
  }
  return { verb: 'uninstall', changes, summary, record: null };
}
