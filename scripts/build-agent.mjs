#!/usr/bin/env node
// Bundle the guest agent (guest/agent/main.ts and everything it imports, npm packages included)
// into one ES module that the guest's node runs without node_modules, and optionally a V8
// start-up snapshot of it:
//
//   node scripts/build-agent.mjs --out FILE [--entry FILE] [--snapshot-blob FILE --node BIN]
//                                [--snapshot-script FILE] [--flags-out FILE]
//
//   --out FILE            where the bundle goes (written atomically: FILE.tmp, then rename)
//   --entry FILE          the entry point (default guest/agent/main.ts); tests bundle a stub this way
//   --snapshot-blob FILE  also build the agent's start-up snapshot (guest/agent/snapshot.ts bundled
//                         as one CommonJS script, run by `node --build-snapshot`): the guest's node
//                         starts from the heap of the evaluated agent instead of parsing, compiling
//                         and evaluating the bundle under emulation. Only for the real agent.
//   --node BIN            the node that builds the snapshot: the guest's own binary (a snapshot
//                         loads only into the node and V8 flags that made it); default this node
//   --snapshot-script FILE  write the snapshot's entry script there instead (the CommonJS bundle
//                         `node --build-snapshot` runs), for a build of the blob inside a guest:
//                         scripts/build-guest.sh does that, because V8 refuses a blob made on a
//                         CPU whose features differ from the vCPU's (CET, which no flag turns off)
//   --flags-out FILE      write AGENT_NODE_FLAGS there (one line), for guest/init
//
// Deterministic bundle: the same sources give the same bytes (no timestamps, no absolute paths,
// no source map), so scripts/build-guest.sh can hash it as one of its inputs. The snapshot blob
// is checked after it is built: the node given loads it with the flags and answers.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { build } from 'esbuild';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The guest runs the host's node (copied into the guest image), so target its major version. */
const NODE_TARGET = `node${process.versions.node.split('.')[0]}`;

/**
 * V8 flags the agent runs with (guest/init reads them from the image). They bound the agent's own
 * heap so that what it allocated once (a burst of output, a big exec) is given back instead of
 * staying resident: an old space of at most 96 MiB (a leak ends in a restart by init, whose
 * containers survive it, not in the guest's OOM killer) and a young generation of 1 MiB
 * semi-spaces instead of up to 16 MiB (scavenges are more frequent and cheap at the agent's
 * allocation rate). A snapshot is tied to the flags it was built with, so the same flags build it.
 */
export const AGENT_NODE_FLAGS = ['--max-old-space-size=96', '--max-semi-space-size=1', ...cpuFeatureFlags()];

/**
 * V8 refuses a start-up snapshot whose version tag differs from its own, and the tag hashes the CPU
 * features V8 found (`--v8-options` lists them: SSE3 ... POPCNT). A blob built on the host therefore
 * did not load on a vCPU with fewer features (TCG's `-cpu max` against an AVX-512 host): the agent
 * started twice on every boot, the second time from its bundle. Turning every optional feature off
 * makes the tag the same on any x86-64 CPU, at the cost of baseline instructions in the agent's
 * JIT code (it serves RPCs; it does no numeric work). Other architectures keep V8's defaults.
 */
function cpuFeatureFlags() {
  if (process.arch !== 'x64') return [];
  const features = ['sse3', 'ssse3', 'sse4-1', 'sse4-2', 'sahf', 'avx', 'avx2', 'fma3', 'bmi1', 'bmi2', 'lzcnt', 'popcnt'];
  return features.map((feature) => `--no-enable-${feature}`);
}

/** The snapshot's deserialized main prints this and exits when KATA_TS_AGENT_SNAPSHOT_CHECK=1. */
const SNAPSHOT_CHECK_LINE = 'kata-ts-agent snapshot ok';

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    entry: { type: 'string', default: path.join(repo, 'guest/agent/main.ts') },
    'snapshot-blob': { type: 'string' },
    'snapshot-script': { type: 'string' },
    node: { type: 'string', default: process.execPath },
    'flags-out': { type: 'string' },
  },
});
if (values.out === undefined) {
  console.error('build-agent: --out FILE is required');
  process.exit(2);
}

/** esbuild options shared by both bundles. */
const common = {
  bundle: true,
  platform: 'node',
  target: NODE_TARGET,
  legalComments: 'none',
  sourcemap: false,
  // Paths in comments and names are relative to the repository, never the builder's checkout.
  absWorkingDir: repo,
  logLevel: 'error',
};

async function bundleModule(entry, out) {
  const tmp = `${out}.tmp`;
  try {
    await build({
      ...common,
      entryPoints: [path.resolve(entry)],
      outfile: tmp,
      format: 'esm',
      // CommonJS dependencies (protobufjs, grpc-js) call require() for node built-ins; an ES module
      // has no require of its own, so give the bundle one.
      banner: {
        js: "import { createRequire as __kataTsCreateRequire } from 'node:module'; const require = __kataTsCreateRequire(import.meta.url);",
      },
    });
    renameSync(tmp, out);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

/** The snapshot entry (guest/agent/snapshot.ts) bundled as one CommonJS script at `script`. */
async function bundleSnapshotScript(script) {
  // import.meta is empty in CommonJS: main.ts's "started directly" check reads it and stays off.
  await build({ ...common, entryPoints: [path.join(repo, 'guest/agent/snapshot.ts')], outfile: script, format: 'cjs' });
}

/** Bundle the snapshot entry as one CommonJS script, build the blob with `node`, check it loads. */
async function buildSnapshot(blob, node) {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-agent-snapshot.'));
  try {
    const script = path.join(scratch, 'agent-snapshot.cjs');
    const tmpBlob = path.join(scratch, 'agent.blob');
    await bundleSnapshotScript(script);
    // --no-warnings is node's, not V8's: it does not change the snapshot's flag hash (the check
    // below runs without it). The builder warns about built-ins it has not verified for snapshots.
    execFileSync(node, [...AGENT_NODE_FLAGS, '--no-warnings', '--snapshot-blob', tmpBlob, '--build-snapshot', script], {
      cwd: scratch,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    const answer = execFileSync(node, [...AGENT_NODE_FLAGS, '--snapshot-blob', tmpBlob], {
      cwd: scratch,
      env: { ...process.env, KATA_TS_AGENT_SNAPSHOT_CHECK: '1' },
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    if (answer.trim() !== SNAPSHOT_CHECK_LINE)
      throw new Error(`the snapshot blob did not load: ${node} answered ${JSON.stringify(answer)}`);
    renameSync(tmpBlob, `${blob}.tmp`);
    renameSync(`${blob}.tmp`, blob);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

try {
  await bundleModule(values.entry, path.resolve(values.out));
  if (values['snapshot-blob'] !== undefined) await buildSnapshot(path.resolve(values['snapshot-blob']), values.node);
  if (values['snapshot-script'] !== undefined) await bundleSnapshotScript(path.resolve(values['snapshot-script']));
  if (values['flags-out'] !== undefined) writeFileSync(values['flags-out'], `${AGENT_NODE_FLAGS.join(' ')}\n`);
} catch (err) {
  console.error(`build-agent: bundling ${values.entry} failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
