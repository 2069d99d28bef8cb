import { realpathSync } from 'node:fs';
import path from 'node:path';
import { errorMessage } from '../common/errors.js';
import { createLogger, type Logger } from '../common/logger.js';
import { loadConfig } from '../config/load.js';
import type { LoadedConfig } from '../config/types.js';
import { startDaemon } from '../daemon/daemon.js';
import { type CommandLine, placeInNamespace, runInsideMountNamespace } from '../runtime/mount-namespace.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';
import { controlSocketPath, serveControlSocket } from './pause.js';

const HELP = `Usage: kata-ts serve [--config FILE] [--socket PATH] [--state-dir DIR]

Runs the CRI daemon. Without --config, /etc/kata-ts/config.json is read when it exists, else the
built-in defaults apply. --socket and --state-dir override the config file. SIGTERM or SIGINT stop
the daemon gracefully; pod VMs keep running and are found again at the next start.

The daemon makes its mounts in the runtime's own mount namespace (mountNamespacePath, created when
missing): this process runs the daemon again inside it, passes SIGTERM, SIGINT and SIGHUP on, and
exits with its exit code. 'kata-ts mount-namespace' shows or removes that namespace.
`;

/** Load the config and apply command-line overrides (absolute paths only). */
export async function loadWithOverrides(values: { config?: string; socket?: string; 'state-dir'?: string }): Promise<LoadedConfig> {
  const loaded = await loadConfig(values.config);
  for (const [flag, value] of [
    ['--socket', values.socket],
    ['--state-dir', values['state-dir']],
  ] as const) {
    if (value !== undefined && !path.isAbsolute(value)) throw new UsageError(`${flag} must be an absolute path, got "${value}"`);
  }
  if (values.socket !== undefined) loaded.config.socketPath = values.socket;
  if (values['state-dir'] !== undefined) loaded.config.stateDir = values['state-dir'];
  return loaded;
}

/**
 * This program again, with `argv` after `serve`: this process's node, its flags and its script,
 * by its real path, so that the daemon in the namespace runs this code even when a release
 * install flipped `current` meanwhile (src/release/).
 */
function selfCommand(argv: readonly string[]): CommandLine {
  const script = process.argv[1] ?? '';
  let real = script;
  try {
    real = realpathSync(script);
  } catch {
    // not a file (e.g. a loader's virtual entry): run it as named
  }
  return { command: process.execPath, args: [...process.execArgv, real, 'serve', ...argv] };
}

export async function runServeCommand(argv: string[], io: CliIo, self: CommandLine = selfCommand(argv)): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    config: { type: 'string' },
    socket: { type: 'string' },
    'state-dir': { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  });
  if (values.help === true) {
    io.stdout.write(HELP);
    return 0;
  }
  const loaded = await loadWithOverrides(values);
  const logger = createLogger({ level: loaded.config.logLevel });
  const nsFile = loaded.config.mountNamespacePath;
  if (nsFile !== null && (await placeInNamespace(nsFile, process.env)) === 'outside') {
    // Node cannot enter a mount namespace itself: the daemon runs as a child that starts inside.
    return runInsideMountNamespace({ file: nsFile, self, cwd: process.cwd(), env: process.env, stdio: 'inherit', logger });
  }
  const unguard = guardUnhandledRejections(logger);
  const daemon = await startDaemon({ loaded, logger });
  // `kata-ts pause|resume` reach the daemon's pods here (src/cli/pause.ts).
  const control = await serveControlSocket(controlSocketPath(loaded.config.stateDir), daemon.pods, logger).catch(async (err: unknown) => {
    await daemon.close();
    throw err;
  });
  await new Promise<void>((resolve) => {
    const stop = (signal: NodeJS.Signals): void => {
      logger.info({ signal }, 'shutting down');
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      resolve();
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
  await control.close();
  await daemon.close();
  unguard();
  return 0;
}

/**
 * A rejected promise nobody awaited (one pod's background work: a watcher, a reconnect, a pump) is
 * logged with its error and the daemon serves on: it is one pod's failure, and Node would
 * otherwise end the process, and every pod's service with it. A synchronous throw nobody caught
 * stays fatal, as Node makes it: the state it leaves is unknown, and the pods' VMs outlive the
 * daemon, which its unit restarts and which re-attaches them from their records. Returns the undo.
 */
export function guardUnhandledRejections(logger: Logger): () => void {
  const onRejection = (err: unknown): void => logger.error({ err: errorMessage(err) }, 'unhandled rejection (the daemon keeps serving)');
  process.on('unhandledRejection', onRejection);
  return () => process.off('unhandledRejection', onRejection);
}
