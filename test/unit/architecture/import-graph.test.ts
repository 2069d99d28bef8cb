/**
 * The checks layers.test.ts runs over the real tree, fed made-up graphs here so that each one is
 * seen to fail when it should: a circle (of two, of three, a file importing itself), an import
 * against the table, a folder with no row, a table whose floors loop.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  findCycles,
  importGraph,
  importSpecifiers,
  type LayerTable,
  layerTableCycles,
  layerViolations,
  staleFolderRows,
  unplacedFolders,
} from './import-graph.js';

const graphOf = (edges: Record<string, string[]>) => new Map(Object.entries(edges));

describe('findCycles', () => {
  it('finds nothing in a graph whose arrows all point one way', () => {
    expect(findCycles(graphOf({ a: ['b', 'c'], b: ['c'], c: [] }))).toEqual([]);
  });

  it('finds a circle of two, a circle of three and a file importing itself, apart', () => {
    const g = graphOf({ a: ['b'], b: ['a', 'c'], c: ['d'], d: ['e'], e: ['c'], f: ['f'], g: ['a'] });
    expect(findCycles(g)).toEqual([['a', 'b'], ['c', 'd', 'e'], ['f']]);
  });

  it('ignores arrows to nodes outside the graph', () => {
    expect(findCycles(graphOf({ a: ['x'], b: ['a'] }))).toEqual([]);
  });

  it('walks a long chain without overflowing the stack', () => {
    const n = 20_000;
    const edges: Record<string, string[]> = {};
    for (let i = 0; i < n; i++) edges[`n${i}`] = [`n${(i + 1) % n}`];
    expect(findCycles(graphOf(edges))[0]?.length).toBe(n);
  });
});

describe('importSpecifiers and importGraph', () => {
  it('reads static, type-only, multi-line, re-export, bare and dynamic imports', () => {
    const text = [
      "import { a } from './a.js';",
      "import type { B } from './b.js';",
      'import {',
      '  c,',
      "} from './c.js';",
      "export { d } from './d.js';",
      "export type * from './e.js';",
      "import './f.js';",
      "const g = await import('./g.js');",
      "import path from 'node:path';",
    ].join('\n');
    expect(importSpecifiers(text).sort()).toEqual(['./a.js', './b.js', './c.js', './d.js', './e.js', './f.js', './g.js', 'node:path']);
  });

  it('builds a graph of relative imports that a type-only circle shows up in', () => {
    const files = ['/r/x/a.ts', '/r/x/b.ts', '/r/y/c.ts'];
    const texts: Record<string, string> = {
      '/r/x/a.ts': "import type { B } from './b.js';\nimport { z } from 'zod';",
      '/r/x/b.ts': "import type { A } from './a.js';\nimport { c } from '../y/c.js';",
      '/r/y/c.ts': '',
    };
    const graph = importGraph(files, (f) => texts[f]!);
    expect(graph.get('/r/x/b.ts')).toEqual(['/r/x/a.ts', '/r/y/c.ts']);
    expect(findCycles(graph)).toEqual([['/r/x/a.ts', '/r/x/b.ts']]);
  });
});

describe('the layer table checks', () => {
  const root = '/r';
  const table: LayerTable = {
    folders: { low: 'low', mid: 'mid', 'mid/sub': 'mid', high: 'high' },
    mayImport: { low: [], mid: ['low'], high: ['mid', 'low'] },
    exceptions: [{ fromLayer: 'low', file: 'mid/ok.ts', why: 'test' }],
  };
  const f = (p: string) => path.join(root, p);

  it('passes imports that point down or stay in a layer, and the listed exceptions', () => {
    const graph = graphOf({
      [f('high/h.ts')]: [f('mid/sub/m.ts'), f('low/l.ts')],
      [f('mid/sub/m.ts')]: [f('mid/n.ts')],
      [f('low/l.ts')]: [f('mid/ok.ts')],
    });
    expect(layerViolations(graph, root, table)).toEqual([]);
  });

  it('reports an import that points up, and a file in a folder with no row', () => {
    const graph = graphOf({ [f('low/l.ts')]: [f('high/h.ts')], [f('other/o.ts')]: [] });
    expect(layerViolations(graph, root, table)).toEqual([
      'low/l.ts imports high/h.ts (low -> high)',
      'other/o.ts: its folder has no row in the layer table',
    ]);
  });

  it('reports folders without a row and rows without a folder', () => {
    expect(unplacedFolders(table, ['low', 'mid', 'mid/sub', 'high', 'new'])).toEqual(['new']);
    expect(staleFolderRows(table, ['low', 'mid', 'high'])).toEqual(['mid/sub']);
  });

  it('reports a table whose layers may import each other', () => {
    expect(layerTableCycles(table)).toEqual([]);
    expect(layerTableCycles({ ...table, mayImport: { ...table.mayImport, low: ['high'] } })).toEqual([['high', 'low', 'mid']]);
  });
});
