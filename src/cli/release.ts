/**
 * `kata-ts release install|use|list|prune|remove`: kata-ts on a node as releases side by side
 * (src/release/layout.ts; docs/operations.md "Installing on a node and upgrading"). A new release
 * becomes `current` for the processes started after it; running shims keep the code they started
 * with, and a release stays until no process runs it.
 */
import { promises as fsp, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { errnoCode, isKataError } from '../common/errors.js';
import { isSameLiveProcess, readCmdline } from '../common/procfs.js';
import { loadConfig } from '../config/load.js';
import {
  abandonedDirs,
  type CopyProgress,
  checkWritable,
  executeInstall,
  readLayout,
  readReleaseInfo,
  removeRelease,
} from '../release/install.js';
import {
  DEFAULT_BIN_DIR,
  DEFAULT_PREFIX,
  type ReleasePaths,
  releaseId,
  releasePaths,
  runningRelease,
  validateReleaseId,
} from '../release/layout.js';
import { checkRemove, currentRelease, describeStep, type InstallStep, planInstall, planPrune, type ReleaseUsers } from '../release/plan.js';
import { readSourceTree, treeSha256 } from '../release/tree.js';
import { STATE_LOCK_FILE } from '../runtime/state-lock.js';
import { readShimInfo, SOCKET_DIR } from '../shim/paths.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const HELP = `Usage: kata-ts release <command> [options]

kata-ts installed on a node as releases side by side: <prefix>/releases/<id>/ (complete or
absent), <prefix>/current (the release new processes run) and links in the bin dir into
<prefix>/current (kata-ts to bin/kata-ts.js, the shim names to the native start front
dist/native/kata-ts-shim-start). Pods keep the release their shim started with until they end.

  install [--prefix DIR] [--bin-dir DIR] [--from DIR] [--dry-run]
            copy a built kata-ts (default: the one running this command) into a new release,
            make it current and link kata-ts, containerd-shim-kata-ts-v2 and
            containerd-shim-kata-ts-cvm-v2 in the bin dir; nothing changes when it is already so
  use <id> [--prefix DIR] [--bin-dir DIR] [--dry-run]
            make an installed release current again (rollback)
  list [--prefix DIR] [--config FILE] [--state-root DIR]
            the releases, which one is current, and the running shims of each
  prune [--prefix DIR] [--config FILE] [--state-root DIR] [--dry-run]
            remove every release that is neither current nor used by a running process
  remove <id> [--prefix DIR] [--config FILE] [--state-root DIR]
            remove one release (refused when it is current or in use)

Defaults: --prefix ${DEFAULT_PREFIX}, --bin-dir ${DEFAULT_BIN_DIR}; the shims' state root is
shim.stateRoot of the config file (--config, else KATA_TS_CONFIG, else /etc/kata-ts/config.json).
`;

const PATH_OPTIONS = {
  prefix: { type: 'string' },
  'bin-dir': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;
const STATE_OPTIONS = { config: { type: 'string' }, 'state-root': { type: 'string' } } as const;

function pathsOf(values: { prefix?: string | undefined; 'bin-dir'?: string | undefined }): ReleasePaths {
  return releasePaths(values.prefix ?? DEFAULT_PREFIX, values['bin-dir'] ?? DEFAULT_BIN_DIR);
}

function mib(bytes: number): string {
  return (bytes / (1024 * 1024)).toFixed(1);
}

/** Prints copy progress about every tenth of the files. */
function progressPrinter(io: CliIo): (p: CopyProgress) => void {
  let next = 0;
  return (p) => {
    if (p.files < next && p.files !== p.totalFiles) return;
    next = p.files + Math.max(1, Math.ceil(p.totalFiles / 10));
    io.stdout.write(`  copied ${p.files}/${p.totalFiles} files (${mib(p.bytes)}/${mib(p.totalBytes)} MiB)\n`);
  };
}

async function printAndRun(
  io: CliIo,
  paths: ReleasePaths,
  steps: readonly InstallStep[],
  dryRun: boolean,
  id: string,
  run: () => Promise<void>,
): Promise<number> {
  if (steps.length === 0) {
    io.stdout.write(`release ${id} is installed, current and linked in ${paths.binDir} already: nothing changed\n`);
    return 0;
  }
  if (dryRun) {
    io.stdout.write(`would (--dry-run, nothing changed):\n${steps.map((s) => `  ${describeStep(s, paths)}\n`).join('')}`);
    return 0;
  }
  await checkWritable(paths.prefix, '--prefix');
  await checkWritable(paths.binDir, '--bin-dir');
  await run();
  io.stdout.write(`release ${id} is current\n`);
  return 0;
}

async function runInstall(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { ...PATH_OPTIONS, from: { type: 'string' }, 'dry-run': { type: 'boolean' } });
  if (positionals.length > 0) throw new UsageError(`install takes no arguments, got "${positionals.join(' ')}"`);
  const paths = pathsOf(values);
  const from = values.from ?? runningRelease().dir;
  if (!path.isAbsolute(from)) throw new UsageError(`--from must be an absolute path, got "${from}"`);
  const tree = await readSourceTree(from);
  io.stdout.write(`reading ${tree.root}: kata-ts ${tree.version}, ${tree.files} files, ${mib(tree.bytes)} MiB\n`);
  const sha = await treeSha256(tree);
  const id = releaseId(tree.version, sha);
  const steps = planInstall(paths, await readLayout(paths), id);
  const info = { id, version: tree.version, contentSha256: sha, from: tree.root, installedAt: new Date().toISOString() };
  return printAndRun(io, paths, steps, values['dry-run'] === true, id, () =>
    executeInstall(paths, steps, {
      tree,
      info,
      onStep: (s) => io.stdout.write(`${describeStep(s, paths)}\n`),
      onProgress: progressPrinter(io),
    }),
  );
}

async function runUse(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { ...PATH_OPTIONS, 'dry-run': { type: 'boolean' } }, true);
  if (positionals.length !== 1) throw new UsageError('use takes one release id (see kata-ts release list)');
  const id = positionals[0]!;
  validateReleaseId(id);
  const paths = pathsOf(values);
  const steps = planInstall(paths, await readLayout(paths), id, true);
  return printAndRun(io, paths, steps, values['dry-run'] === true, id, () =>
    executeInstall(paths, steps, { onStep: (s) => io.stdout.write(`${describeStep(s, paths)}\n`) }),
  );
}

/** The shims' state root: --state-root, else shim.stateRoot of the config file. */
async function stateRootOf(values: { config?: string | undefined; 'state-root'?: string | undefined }): Promise<string> {
  const root = values['state-root'];
  if (root !== undefined) {
    if (!path.isAbsolute(root)) throw new UsageError(`--state-root must be an absolute path, got "${root}"`);
    return root;
  }
  const file = values.config ?? (process.env.KATA_TS_CONFIG === '' ? undefined : process.env.KATA_TS_CONFIG);
  return (await loadConfig(file)).config.shim.stateRoot;
}

/** The release a command line runs: the id after `/releases/` in any of its arguments. */
function releaseInCmdline(args: readonly string[], ids: ReadonlySet<string>): string | undefined {
  for (const arg of args) {
    for (const m of arg.matchAll(/\/releases\/([^/]+)\//g)) if (ids.has(m[1]!)) return m[1];
  }
  return undefined;
}

function comm(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '?';
  }
}

async function readDirNames(dir: string): Promise<string[]> {
  try {
    return (await fsp.readdir(dir)).sort();
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return [];
    throw err;
  }
}

/**
 * Who runs each release: the live shims under the state root (shim.json names the pod and its
 * release; the pod's lock names the shim by pid and start time, so a dead shim or a reused pid
 * does not count), then every other live process whose command line runs from a release dir
 * (a `start` or `delete` under way, a `kata-ts serve`, a shim older than the release field).
 */
export async function releaseUsers(stateRoot: string, ids: readonly string[]): Promise<Map<string, string[]>> {
  const known = new Set(ids);
  const users = new Map<string, string[]>();
  const add = (id: string, who: string) => users.set(id, [...(users.get(id) ?? []), who]);
  const counted = new Set<number>();
  for (const ns of await readDirNames(stateRoot)) {
    if (ns === SOCKET_DIR) continue;
    for (const pod of await readDirNames(path.join(stateRoot, ns))) {
      const stateDir = path.join(stateRoot, ns, pod);
      const info = await readShimInfo(stateDir).catch(() => undefined);
      if (info === undefined) continue;
      const lock = await fsp.readFile(path.join(stateDir, STATE_LOCK_FILE), 'utf8').catch(() => '');
      const m = /^([0-9]+) ([0-9]+)/.exec(lock);
      if (m === null || Number(m[1]) !== info.pid || !isSameLiveProcess(info.pid, Number(m[2]))) continue;
      const id = info.release?.id ?? releaseInCmdline(readCmdline(info.pid), known);
      if (id === undefined || id === null || !known.has(id)) continue;
      counted.add(info.pid);
      add(id, `pod ${info.sandboxId} (${info.namespace}), shim pid ${info.pid}`);
    }
  }
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid || counted.has(pid)) continue;
    let args: string[];
    try {
      args = readCmdline(pid);
    } catch {
      continue;
    }
    const id = releaseInCmdline(args, known);
    if (id !== undefined) add(id, `pid ${pid} (${comm(pid)})`);
  }
  return users;
}

async function runList(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { ...PATH_OPTIONS, ...STATE_OPTIONS });
  if (positionals.length > 0) throw new UsageError(`list takes no arguments, got "${positionals.join(' ')}"`);
  const paths = pathsOf(values);
  const layout = await readLayout(paths);
  const current = currentRelease(layout);
  const users = await releaseUsers(await stateRootOf(values), layout.releases);
  if (layout.releases.length === 0) {
    io.stdout.write(`no releases in ${paths.releasesDir}\n`);
    return 0;
  }
  for (const id of layout.releases) {
    const info = await readReleaseInfo(paths, id);
    const using = users.get(id) ?? [];
    io.stdout.write(
      `${id === current ? '*' : ' '} ${id}  ${info === undefined ? '' : `installed ${info.installedAt}  `}${id === current ? 'current  ' : ''}${using.length} running\n`,
    );
    for (const who of using) io.stdout.write(`      ${who}\n`);
  }
  return 0;
}

async function runPrune(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { ...PATH_OPTIONS, ...STATE_OPTIONS, 'dry-run': { type: 'boolean' } });
  if (positionals.length > 0) throw new UsageError(`prune takes no arguments, got "${positionals.join(' ')}"`);
  const paths = pathsOf(values);
  const dryRun = values['dry-run'] === true;
  const layout = await readLayout(paths);
  const users: ReleaseUsers = await releaseUsers(await stateRootOf(values), layout.releases);
  const decision = planPrune(layout.releases, currentRelease(layout), users);
  for (const keep of decision.keep) {
    io.stdout.write(
      keep.why === 'current'
        ? `keeping ${keep.id}: it is current\n`
        : `keeping ${keep.id}: in use by ${keep.users.length} process(es): ${keep.users.join('; ')}\n`,
    );
  }
  const abandoned = await abandonedDirs(paths);
  if (decision.remove.length === 0 && abandoned.length === 0) {
    io.stdout.write('nothing to prune\n');
    return 0;
  }
  if (!dryRun) await checkWritable(paths.releasesDir, '--prefix');
  for (const id of decision.remove) {
    if (!dryRun) await removeRelease(paths, id);
    io.stdout.write(`${dryRun ? 'would remove' : 'removed'} ${id}\n`);
  }
  for (const dir of abandoned) {
    if (!dryRun) await fsp.rm(dir, { recursive: true, force: true });
    io.stdout.write(`${dryRun ? 'would remove' : 'removed'} ${dir} (left by an install or removal that did not finish)\n`);
  }
  return 0;
}

async function runRemove(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { ...PATH_OPTIONS, ...STATE_OPTIONS }, true);
  if (positionals.length !== 1) throw new UsageError('remove takes one release id (see kata-ts release list)');
  const id = positionals[0]!;
  validateReleaseId(id);
  const paths = pathsOf(values);
  const layout = await readLayout(paths);
  checkRemove(paths, layout.releases, currentRelease(layout), await releaseUsers(await stateRootOf(values), layout.releases), id);
  await checkWritable(paths.releasesDir, '--prefix');
  await removeRelease(paths, id);
  io.stdout.write(`removed ${id}\n`);
  return 0;
}

const SUBCOMMANDS: Record<string, (argv: string[], io: CliIo) => Promise<number>> = {
  install: runInstall,
  use: runUse,
  list: runList,
  prune: runPrune,
  remove: runRemove,
};

export async function runReleaseCommand(argv: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || rest.includes('--help') || rest.includes('-h')) {
    io.stdout.write(HELP);
    return name === undefined ? 2 : 0;
  }
  const sub = SUBCOMMANDS[name];
  if (sub === undefined) throw new UsageError(`unknown release command "${name}"; commands: ${Object.keys(SUBCOMMANDS).join(', ')}`);
  try {
    return await sub(rest, io);
  } catch (err) {
    // A coded error prints its reason, so scripts (and the DaemonSet's log) can match on it.
    if (isKataError(err)) {
      io.stderr.write(`kata-ts release ${name}: ${err.reason}: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}
