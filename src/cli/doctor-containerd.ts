/**
 * `kata-ts doctor`'s containerd section: the containerd release and whether kata-ts supports it,
 * the shim binaries where containerd looks for them, and the kata-ts handlers in its config
 * (imports followed). The integration is optional (kata-ts also runs standalone): while no kata-ts
 * handler is configured, what is missing is a warning; once one is, a failure. Every check that
 * is not ok ends with the sentence that fixes it.
 */
import { accessSync, constants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errorMessage } from '../common/errors.js';
import {
  type ContainerdVersion,
  DEFAULT_CONTAINERD_CONFIG,
  detectContainerdVersion,
  formatVersion,
  inspectContainerdConfig,
  KATA_TS_RUNTIMES,
  supportedSchemas,
} from '../install/index.js';

export interface ContainerdCheck {
  name: string;
  verdict: 'ok' | 'warn' | 'fail';
  message: string;
}

export interface ContainerdCheckOptions {
  /** containerd's config (default /etc/containerd/config.toml). */
  configPath?: string;
  /** The containerd binary asked for its version (default: on PATH). */
  binary?: string;
  /** /proc, where a running containerd's PATH is read. */
  procRoot?: string;
}

function executableIn(dir: string, name: string): string | null {
  const file = path.join(dir, name);
  try {
    accessSync(file, constants.X_OK);
    return file;
  } catch {
    return null;
  }
}

/** The command line flag value of `--config`/`-c` in a containerd argv. */
function configArg(argv: string[]): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--config' || a === '-c') return argv[i + 1];
    if (a.startsWith('--config=')) return a.slice('--config='.length);
  }
  return undefined;
}

/**
 * The running containerd that reads `configPath` (its PATH and its binary's directory are where it
 * looks for shims), or undefined when none runs.
 */
async function runningContainerd(procRoot: string, configPath: string): Promise<{ pid: number; path: string; exeDir: string } | undefined> {
  const entries = await fsp.readdir(procRoot).catch(() => [] as string[]);
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const exe = await fsp.readlink(path.join(procRoot, e, 'exe'));
      if (path.basename(exe) !== 'containerd') continue;
      const argv = (await fsp.readFile(path.join(procRoot, e, 'cmdline'), 'utf8')).split('\0').filter((x) => x !== '');
      if (path.resolve(configArg(argv) ?? DEFAULT_CONTAINERD_CONFIG) !== path.resolve(configPath)) continue;
      const env = (await fsp.readFile(path.join(procRoot, e, 'environ'), 'utf8')).split('\0');
      const pathVar = env.find((v) => v.startsWith('PATH='))?.slice(5) ?? '';
      return { pid: Number(e), path: pathVar, exeDir: path.dirname(exe) };
    } catch {
      // gone, or not ours to read
    }
  }
  return undefined;
}

const INSTALL_FIX = (config: string) =>
  `run \`kata-ts install --containerd${config === DEFAULT_CONTAINERD_CONFIG ? '' : ` --config ${config}`}\` and restart containerd`;

export async function containerdChecks(options: ContainerdCheckOptions = {}): Promise<ContainerdCheck[]> {
  const configPath = options.configPath ?? DEFAULT_CONTAINERD_CONFIG;
  const checks: ContainerdCheck[] = [];
  let version: ContainerdVersion | null = null;
  let versionError = '';
  try {
    version = await detectContainerdVersion(options.binary);
  } catch (err) {
    versionError = errorMessage(err);
  }

  let inspection: Awaited<ReturnType<typeof inspectContainerdConfig>> | undefined;
  let configError = '';
  try {
    inspection = await inspectContainerdConfig(configPath, version);
  } catch (err) {
    configError = errorMessage(err);
  }
  const configured = inspection?.handlers.filter((h) => h.file !== null) ?? [];
  // The integration is in use once any kata-ts handler is configured.
  const inUse = configured.length > 0;
  const missing = inUse ? 'fail' : 'warn';

  if (version === null) {
    checks.push({
      name: 'containerd',
      verdict: inUse ? 'fail' : 'ok',
      message: inUse
        ? `${versionError}; kata-ts handlers are configured in ${configPath}: install containerd 1.6, 1.7 or 2.x`
        : `containerd not found (${versionError.replace(/; pass --containerd-version$/, '')}): kata-ts runs standalone only`,
    });
    return checks;
  }
  const supported = supportedSchemas(version) !== null;
  checks.push({
    name: 'containerd',
    verdict: supported ? 'ok' : missing,
    message: supported
      ? `containerd ${formatVersion(version)}: supported (1.6, 1.7, 2.x)`
      : `containerd ${formatVersion(version)} is not supported by kata-ts's shim: upgrade containerd to 1.6, 1.7 or 2.x`,
  });

  if (inspection === undefined) {
    checks.push({ name: 'containerd-handlers', verdict: 'fail', message: `${configError}: fix the file, then ${INSTALL_FIX(configPath)}` });
  } else {
    const wrong = inspection.handlers.filter((h) => h.file !== null && h.configuredType !== h.runtimeType);
    const absent = inspection.handlers.filter((h) => h.file === null);
    const where = inspection.exists
      ? `${configPath}${inspection.files.length > 1 ? ` (+${inspection.files.length - 1} imported)` : ''}`
      : `${configPath} (absent)`;
    if (wrong.length > 0) {
      checks.push({
        name: 'containerd-handlers',
        verdict: 'fail',
        message: `${wrong.map((h) => `${h.handler} in ${h.file} has runtime_type ${h.configuredType ?? '(none)'}, not ${h.runtimeType}`).join('; ')}: ${INSTALL_FIX(configPath)} after removing that table`,
      });
    } else if (absent.length > 0) {
      checks.push({
        name: 'containerd-handlers',
        verdict: missing,
        message: `${absent.map((h) => h.handler).join(' and ')} not in ${where}: ${INSTALL_FIX(configPath)}`,
      });
    } else {
      checks.push({
        name: 'containerd-handlers',
        verdict: 'ok',
        message: `${inspection.handlers.map((h) => `${h.handler} (${h.runtimeType}) in ${h.file}`).join('; ')}`,
      });
    }
  }

  // containerd finds `containerd-shim-<name>-<version>` on its PATH, then beside its own binary.
  const running = await runningContainerd(options.procRoot ?? '/proc', configPath);
  const searchPath = running?.path ?? process.env.PATH ?? '';
  const dirs = [...searchPath.split(path.delimiter).filter((d) => d !== ''), ...(running === undefined ? [] : [running.exeDir])];
  const found = KATA_TS_RUNTIMES.map((r) => ({ r, file: dirs.map((d) => executableIn(d, r.shimBinary)).find((f) => f !== null) ?? null }));
  const whose =
    running === undefined ? "this shell's PATH (no containerd running with that config)" : `the PATH of containerd (pid ${running.pid})`;
  const absentShims = found.filter((f) => f.file === null);
  checks.push(
    absentShims.length === 0
      ? { name: 'containerd-shims', verdict: 'ok', message: found.map((f) => f.file).join(', ') }
      : {
          name: 'containerd-shims',
          verdict: missing,
          message: `${absentShims.map((f) => f.r.shimBinary).join(' and ')} not on ${whose}: install kata-ts's binaries (\`kata-ts release install\`, or scripts/setup.sh) into a directory there, e.g. /usr/local/bin`,
        },
  );
  return checks;
}
