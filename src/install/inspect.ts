/**
 * What containerd will make of its configuration for kata-ts (for `kata-ts doctor`): which of our
 * handlers it defines after following imports, and with which runtime type.
 */
import { type ContainerdConfigDocument, parseContainerdConfig } from './document.js';
import { readImports, readTextFile } from './files.js';
import { KATA_TS_RUNTIMES } from './handlers.js';
import type { ContainerdVersion } from './version.js';

export interface HandlerPresence {
  handler: string;
  runtimeType: string;
  /** The file whose table containerd uses; null when no file defines it. */
  file: string | null;
  /** The table's runtime_type, when defined. */
  configuredType: string | null;
}

export interface ConfigInspection {
  configPath: string;
  exists: boolean;
  version: number | null;
  /** Files read, the config first, in containerd's load order. */
  files: string[];
  handlers: HandlerPresence[];
}

/**
 * containerd 1.x replaces a whole plugin section with an imported file's (the last file naming the
 * CRI plugin wins, tables and all); 2.x merges tables, so a later file's table wins per runtime.
 */
export async function inspectContainerdConfig(configPath: string, version: ContainerdVersion | null): Promise<ConfigInspection> {
  const text = await readTextFile(configPath);
  if (text === null) {
    return {
      configPath,
      exists: false,
      version: null,
      files: [],
      handlers: KATA_TS_RUNTIMES.map((r) => ({ handler: r.handler, runtimeType: r.runtimeType, file: null, configuredType: null })),
    };
  }
  const main = parseContainerdConfig(configPath, text);
  const { imported } = await readImports(configPath, text);
  const docs: ContainerdConfigDocument[] = [main, ...imported.map((f) => parseContainerdConfig(f.path, f.text))];
  const replaceWhole = version !== null && version.major < 2;
  const handlers = KATA_TS_RUNTIMES.map((r): HandlerPresence => {
    let file: string | null = null;
    let configuredType: string | null = null;
    for (const d of docs) {
      const t = d.handlers[r.handler];
      if (t !== undefined) {
        file = d.path;
        configuredType = typeof t.runtime_type === 'string' ? t.runtime_type : null;
      } else if (replaceWhole && d.definesCriPlugin && d !== main) {
        file = null;
        configuredType = null;
      }
    }
    return { handler: r.handler, runtimeType: r.runtimeType, file, configuredType };
  });
  return { configPath, exists: true, version: main.version, files: docs.map((d) => d.path), handlers };
}
