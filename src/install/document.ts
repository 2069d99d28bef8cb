import { parse, TomlError } from 'smol-toml';
import { invalid } from '../common/errors.js';
import './reasons.js';
import { type HandlerTable, KATA_TS_RUNTIMES, runtimesPath } from './handlers.js';
import type { ConfigSchema } from './version.js';

/** A containerd config file decoded once: its schema version, imports and our handlers' tables. */
export interface ContainerdConfigDocument {
  path: string;
  /** The `version` key; null when absent (containerd reads that as the version 1 layout). */
  version: number | null;
  /** `imports`, as written. */
  imports: string[];
  /** Whether the document holds no key at all (empty, or comments only). */
  empty: boolean;
  /** Our handlers' tables where present (by handler name), read in the file's own schema. */
  handlers: Record<string, HandlerTable>;
  /** Whether the file configures the CRI plugin of its schema at all. */
  definesCriPlugin: boolean;
}

type TomlTable = Record<string, unknown>;

function isTable(v: unknown): v is TomlTable {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

function at(doc: TomlTable, keys: string[]): unknown {
  let cur: unknown = doc;
  for (const k of keys) {
    if (!isTable(cur)) return undefined;
    cur = cur[k];
  }
  return cur;
}

/** The schema a file's tables are written in: its `version` (3, else 2's layout). */
export function schemaOf(version: number | null): ConfigSchema {
  return version === 3 ? 3 : 2;
}

/** Parse a config file's text; INVALID_ARGUMENT naming the file when it is not TOML or its fields have the wrong types. */
export function parseContainerdConfig(path: string, text: string): ContainerdConfigDocument {
  let doc: TomlTable;
  try {
    doc = parse(text) as TomlTable;
  } catch (err) {
    const where = err instanceof TomlError ? ` (line ${err.line}, column ${err.column})` : '';
    throw invalid('CONTAINERD_CONFIG_INVALID', `${path} is not valid TOML${where}`, { cause: err });
  }
  const version = doc.version;
  if (version !== undefined && typeof version !== 'bigint' && typeof version !== 'number') {
    throw invalid('CONTAINERD_CONFIG_INVALID', `${path}: \`version\` must be an integer`);
  }
  const imports = doc.imports ?? [];
  if (!Array.isArray(imports) || imports.some((x) => typeof x !== 'string')) {
    throw invalid('CONTAINERD_CONFIG_INVALID', `${path}: \`imports\` must be a list of strings`);
  }
  const v = version === undefined ? null : Number(version);
  const schema = schemaOf(v);
  const runtimes = at(doc, runtimesPath(schema));
  const handlers: Record<string, HandlerTable> = {};
  if (isTable(runtimes)) {
    for (const { handler } of KATA_TS_RUNTIMES) {
      const t = runtimes[handler];
      if (isTable(t)) handlers[handler] = t as HandlerTable;
      else if (t !== undefined) throw invalid('CONTAINERD_CONFIG_INVALID', `${path}: runtime \`${handler}\` must be a table`);
    }
  }
  return {
    path,
    version: v,
    imports: imports as string[],
    empty: Object.keys(doc).length === 0,
    handlers,
    definesCriPlugin: at(doc, runtimesPath(schema).slice(0, 2)) !== undefined,
  };
}

/** Deep equality of two decoded TOML values (arrays in order). */
export function sameTable(a: unknown, b: unknown): boolean {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => sameTable(x, b[i]));
  }
  if (isTable(a) && isTable(b)) {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return sameTable(ka, kb) && ka.every((k) => sameTable(a[k], b[k]));
  }
  return a === b;
}
