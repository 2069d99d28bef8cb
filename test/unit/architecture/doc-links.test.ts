/**
 * The markdown files link to each other and to code by relative paths and `#anchors`. Files move
 * (the README's depth went to docs/, the CRI face left src/runtime), and a link that points
 * nowhere is only noticed by a reader; this test resolves every relative link in every *.md file
 * of the checkout, and every anchor against the target's headings as GitHub names them.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

const ROOT = packageRoot();
/** Not ours, or built: their markdown is not the project's documentation. */
const SKIPPED_DIRS = new Set(['node_modules', '.git', 'dist', '.cache', 'generated']);

function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    if (e.isDirectory()) return SKIPPED_DIRS.has(e.name) ? [] : markdownFiles(path.join(dir, e.name));
    return e.name.endsWith('.md') ? [path.join(dir, e.name)] : [];
  });
}

/** The text outside fenced code blocks and inline code, where a `[x](y)` is prose, not a link. */
function proseOf(text: string): string {
  return text.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '');
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes. */
function slugOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/`/g, '')
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** Every anchor a file offers, a repeated heading getting `-1`, `-2`, ... as GitHub numbers them. */
function anchorsOf(file: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of proseOf(readFileSync(file, 'utf8')).matchAll(/^#{1,6}\s+(.+?)\s*#*$/gm)) {
    const base = slugOf(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** Every relative link in `file` that does not resolve, as `file: target (why)`. */
function brokenLinks(file: string, root: string): string[] {
  const problems: string[] = [];
  const rel = path.relative(root, file);
  for (const m of proseOf(readFileSync(file, 'utf8')).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
    const target = m[1]!;
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:, file:
    const [pathPart, anchor] = target.split('#', 2) as [string, string | undefined];
    const resolved = pathPart === '' ? file : path.resolve(path.dirname(file), decodeURIComponent(pathPart));
    if (!existsSync(resolved)) {
      problems.push(`${rel}: ${target} (no such file)`);
      continue;
    }
    if (anchor === undefined || anchor === '') continue;
    if (statSync(resolved).isDirectory() || !resolved.endsWith('.md')) {
      problems.push(`${rel}: ${target} (an anchor into something that is not a markdown file)`);
    } else if (!anchorsOf(resolved).has(anchor)) {
      problems.push(`${rel}: ${target} (no heading with that anchor)`);
    }
  }
  return problems;
}

describe('markdown links', () => {
  it('finds the documentation', () => {
    const files = markdownFiles(ROOT).map((f) => path.relative(ROOT, f));
    expect(files).toContain('README.md');
    expect(files).toContain(path.join('docs', 'architecture.md'));
  });

  it('every relative link resolves to a file, and every anchor to a heading', () => {
    expect(markdownFiles(ROOT).flatMap((f) => brokenLinks(f, ROOT))).toEqual([]);
  });

  it('reports a missing file, a missing heading and an anchor into a non-markdown file', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kts-links-'));
    try {
      writeFileSync(path.join(dir, 'b.md'), '# Title\n\n## Two words: here\n\n## Two words: here\n');
      writeFileSync(path.join(dir, 'c.txt'), 'x');
      const a = path.join(dir, 'a.md');
      writeFileSync(
        a,
        [
          '[ok](b.md#title) [ok](b.md#two-words-here) [ok](b.md#two-words-here-1) [ok](#self) [ok](https://example.com/x)',
          '`[code](nowhere.md)`',
          '```',
          '[fenced](nowhere.md)',
          '```',
          '[bad](missing.md) [bad](b.md#nope) [bad](c.txt#x)',
          '# Self',
        ].join('\n'),
      );
      expect(brokenLinks(a, dir)).toEqual([
        'a.md: missing.md (no such file)',
        'a.md: b.md#nope (no heading with that anchor)',
        'a.md: c.txt#x (an anchor into something that is not a markdown file)',
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
