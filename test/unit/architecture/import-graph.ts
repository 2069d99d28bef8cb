/**
 * Reading the source tree's imports as a graph, for the architecture tests: which file imports
 * which (relative imports only, type-only ones included, since a circle of types still ties the
 * files' meanings together and breaks the floors), the circles in that graph, and the imports a
 * layer table forbids. Pure functions over plain data, so each check can be fed a made-up graph
 * and be seen to fail (import-graph.test.ts).
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

/** File -> the files it imports (absolute paths, `.js` specifiers mapped back to their `.ts`). */
export type ImportGraph = Map<string, string[]>;

/** Every `.ts` file under `dir` (tests excluded), skipping the folders named in `skip` (absolute). */
export function sourceFiles(dir: string, skip: ReadonlySet<string> = new Set()): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return skip.has(full) ? [] : sourceFiles(full, skip);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') ? [full] : [];
  });
}

/** Every folder under `dir`, `dir` itself included (absolute). */
export function folders(dir: string): string[] {
  return [
    dir,
    ...readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .flatMap((e) => folders(path.join(dir, e.name))),
  ];
}

/**
 * The module specifiers of a file's text: `import ... from`, `export ... from` (both also as
 * `import type` / `export type`, over several lines), bare `import 'x'`, and `import('x')`.
 */
export function importSpecifiers(text: string): string[] {
  const patterns = [
    /^\s*(?:import|export)\b[^'"]*?\bfrom\s+['"]([^'"]+)['"]/gm,
    /^\s*import\s+['"]([^'"]+)['"]/gm,
    /\bimport\(\s*['"]([^'"]+)['"]\s*\)/g,
  ];
  return patterns.flatMap((re) => [...text.matchAll(re)].map((m) => m[1]!));
}

/** The file a relative specifier names (`./x.js` -> `<dir>/x.ts`); undefined for a package. */
export function resolveRelative(fromFile: string, specifier: string): string | undefined {
  if (!specifier.startsWith('.')) return undefined;
  return path.resolve(path.dirname(fromFile), specifier).replace(/\.js$/, '.ts');
}

/** The graph of relative imports among `files` (an import of a file outside the set is dropped). */
export function importGraph(files: readonly string[], read: (file: string) => string = (f) => readFileSync(f, 'utf8')): ImportGraph {
  const known = new Set(files);
  const graph: ImportGraph = new Map();
  for (const file of files) {
    const targets = importSpecifiers(read(file))
      .map((s) => resolveRelative(file, s))
      .filter((t): t is string => t !== undefined && known.has(t));
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/**
 * The circles of a graph: its strongly connected components of more than one node, plus any node
 * that imports itself (Tarjan's algorithm, iterative so a deep chain cannot overflow the stack).
 * Each circle is sorted, and the list is sorted by its first member, so results compare stably.
 */
export function findCycles(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const cycles: string[][] = [];
  let next = 0;
  const edges = (v: string) => (graph.get(v) ?? []).filter((w) => graph.has(w));

  for (const root of graph.keys()) {
    if (index.has(root)) continue;
    // Each frame: a node and how far through its edges the walk has got.
    const frames: Array<{ node: string; edge: number }> = [{ node: root, edge: 0 }];
    index.set(root, next);
    low.set(root, next);
    next++;
    stack.push(root);
    onStack.add(root);
    while (frames.length > 0) {
      const frame = frames[frames.length - 1]!;
      const out = edges(frame.node);
      if (frame.edge < out.length) {
        const w = out[frame.edge++]!;
        if (!index.has(w)) {
          index.set(w, next);
          low.set(w, next);
          next++;
          stack.push(w);
          onStack.add(w);
          frames.push({ node: w, edge: 0 });
        } else if (onStack.has(w)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(w)!));
        }
        continue;
      }
      frames.pop();
      const v = frame.node;
      const parent = frames[frames.length - 1];
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(v)!));
      if (low.get(v) !== index.get(v)) continue;
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1 || edges(v).includes(v)) cycles.push(component.sort());
    }
  }
  return cycles.sort((a, b) => (a[0]! < b[0]! ? -1 : a[0]! > b[0]! ? 1 : 0));
}

/** An import a layer table allows although the layers do not: one file, and why. */
export interface AllowedFileImport {
  fromLayer: string;
  /** The imported file, relative to the root the table is written against. */
  file: string;
  why: string;
}

export interface LayerTable {
  /** Folder (relative to the root, '/'-separated) -> its layer. Every folder must have a row. */
  folders: Record<string, string>;
  /** Layer -> the other layers its files may import. */
  mayImport: Record<string, readonly string[]>;
  exceptions?: readonly AllowedFileImport[];
}

/** Files whose folder has no row in the table: a new folder must be placed on a floor first. */
export function unplacedFolders(table: LayerTable, folderList: readonly string[]): string[] {
  return folderList.filter((f) => table.folders[f] === undefined);
}

/** Rows of the table for folders that do not exist (any more). */
export function staleFolderRows(table: LayerTable, folderList: readonly string[]): string[] {
  const present = new Set(folderList);
  return Object.keys(table.folders).filter((f) => !present.has(f));
}

/**
 * Every import that crosses layers against the table, as `from -> to (fromLayer -> toLayer)`,
 * with paths relative to `root`. A file in a folder with no row is reported too.
 */
export function layerViolations(graph: ImportGraph, root: string, table: LayerTable): string[] {
  const layerOf = (file: string) => table.folders[path.relative(root, path.dirname(file)).split(path.sep).join('/')];
  const out: string[] = [];
  for (const [file, targets] of graph) {
    const rel = path.relative(root, file);
    const from = layerOf(file);
    if (from === undefined) {
      out.push(`${rel}: its folder has no row in the layer table`);
      continue;
    }
    const allowed = table.mayImport[from] ?? [];
    for (const target of targets) {
      const to = layerOf(target);
      const relTarget = path.relative(root, target).split(path.sep).join('/');
      if (to === from || (to !== undefined && allowed.includes(to))) continue;
      if (table.exceptions?.some((e) => e.fromLayer === from && e.file === relTarget)) continue;
      out.push(`${rel} imports ${relTarget} (${from} -> ${to ?? 'a folder with no row'})`);
    }
  }
  return out;
}

/** The circles among the layers the table allows (a floor must not be allowed to import one above it). */
export function layerTableCycles(table: LayerTable): string[][] {
  const graph = new Map<string, string[]>();
  for (const [layer, allowed] of Object.entries(table.mayImport)) graph.set(layer, [...allowed]);
  return findCycles(graph);
}
