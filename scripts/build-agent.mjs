#!/usr/bin/env node
// Bundle the guest agent (guest/agent/main.ts and everything it imports, npm packages included)
// into one ES module that the guest's node runs without node_modules:
//
//   node scripts/build-agent.mjs --out FILE [--entry FILE]
//
//   --out FILE    where the bundle goes (written atomically: FILE.tmp, then rename)
//   --entry FILE  the entry point (default guest/agent/main.ts); tests bundle a stub this way
//
// Deterministic: the same sources give the same bytes (no timestamps, no absolute paths, no
// source map), so scripts/build-guest.sh can hash the bundle as one of its inputs.
import { renameSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { build } from 'esbuild';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The guest runs the host's node (copied into the guest image), so target its major version. */
const NODE_TARGET = `node${process.versions.node.split('.')[0]}`;

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    entry: { type: 'string', default: path.join(repo, 'guest/agent/main.ts') },
  },
});
if (values.out === undefined) {
  console.error('build-agent: --out FILE is required');
  process.exit(2);
}
const out = path.resolve(values.out);
const tmp = `${out}.tmp`;

try {
  await build({
    entryPoints: [path.resolve(values.entry)],
    outfile: tmp,
    bundle: true,
    platform: 'node',
    target: NODE_TARGET,
    format: 'esm',
    // CommonJS dependencies (protobufjs, grpc-js) call require() for node built-ins; an ES module
    // has no require of its own, so give the bundle one.
    banner: {
      js: "import { createRequire as __kataTsCreateRequire } from 'node:module'; const require = __kataTsCreateRequire(import.meta.url);",
    },
    legalComments: 'none',
    sourcemap: false,
    // Paths in comments and names are relative to the repository, never the builder's checkout.
    absWorkingDir: repo,
    logLevel: 'warning',
  });
  renameSync(tmp, out);
} catch (err) {
  rmSync(tmp, { force: true });
  console.error(`build-agent: bundling ${values.entry} failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
