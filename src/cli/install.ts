import { isKataError } from '../common/errors.js';
import {
  DEFAULT_CONTAINERD_CONFIG,
  defaultBackupPath,
  defaultStatePath,
  detectContainerdVersion,
  executePlan,
  formatVersion,
  gatherInstallInput,
  gatherUninstallInput,
  type InstallPlan,
  parseContainerdVersion,
  planInstall,
  planUninstall,
  SANDBOXERS,
  type Sandboxer,
} from '../install/index.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const usage = (verb: 'install' | 'uninstall'): string => `Usage: kata-ts ${verb} --containerd [--config PATH] [--dry-run]
                    [--containerd-version V | --containerd-binary PATH] [--state-file PATH] [--backup-file PATH]
                    [--host-root DIR]${verb === 'install' ? ' [--sandboxer podsandbox|shim]' : ''}

${
  verb === 'install'
    ? `Writes the runtime handlers kata-ts and kata-ts-cvm into containerd's configuration: a drop-in
where containerd 2.x imports one (config version 3 with an \`imports\` glob), otherwise a marked block
appended to the config (everything else kept byte for byte) after a backup of the original.
Records what it did in the state file; a second install changes nothing.`
    : `Undoes exactly what \`kata-ts install --containerd\` recorded: the config byte for byte as before
(or gone, if install created it), the drop-in, backup and record removed. Nothing recorded: nothing to do.`
}

  --containerd              the containerd integration (the only one so far)
  --config PATH             containerd's config (default: ${DEFAULT_CONTAINERD_CONFIG})
  --dry-run                 print what would change, change nothing
  --containerd-version V    containerd's version (default: from \`containerd --version\`)
  --containerd-binary PATH  the containerd to ask for its version (default: containerd on PATH)
  --state-file PATH         the install record (default: <config>.kata-ts-install.json)
  --backup-file PATH        the original config's backup (default: <config>.kata-ts-backup)
  --host-root DIR           the host's filesystem is mounted at DIR (a DaemonSet's /host): every
                            path above and in containerd's config is the host's, read below DIR
${
  verb === 'install'
    ? `  --sandboxer S             containerd 2.x only: podsandbox (default: a pause container, the shim
                            beside it) or shim (containerd's Sandbox API, no pause container; see
                            docs/shim.md for which to choose)
`
    : ''
}
Restart containerd afterwards for the change to take effect.
Exit status: 0 done (or nothing to do); 1 refused or failed (nothing changed); 2 bad usage.
`;

const OPTIONS = {
  containerd: { type: 'boolean' },
  config: { type: 'string' },
  'dry-run': { type: 'boolean' },
  'containerd-version': { type: 'string' },
  'containerd-binary': { type: 'string' },
  'state-file': { type: 'string' },
  'backup-file': { type: 'string' },
  'host-root': { type: 'string' },
  sandboxer: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

function print(io: CliIo, verb: string, plan: InstallPlan, dryRun: boolean, notes: string[]): void {
  const prefix = !dryRun
    ? `kata-ts ${verb}: `
    : plan.changes.length === 0
      ? `kata-ts ${verb} (dry run): `
      : `kata-ts ${verb} (dry run, nothing changed): would have `;
  // "would have" + the past participle: the same as the past tense for every verb but "wrote".
  const lines = dryRun && plan.changes.length > 0 ? plan.summary.map((l) => l.replace(/^wrote /, 'written ')) : plan.summary;
  for (const line of [...lines, ...notes]) io.stdout.write(`${prefix}${line}\n`);
  if (plan.changes.length > 0 && !dryRun) io.stdout.write(`kata-ts ${verb}: restart containerd for the change to take effect\n`);
}

async function run(verb: 'install' | 'uninstall', argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, OPTIONS);
  if (values.help === true) {
    io.stdout.write(usage(verb));
    return 0;
  }
  if (values.containerd !== true) throw new UsageError(`--containerd is required (the integration to ${verb}; see kata-ts ${verb} --help)`);
  const configPath = values.config ?? DEFAULT_CONTAINERD_CONFIG;
  const paths = {
    configPath,
    statePath: values['state-file'] ?? defaultStatePath(configPath),
    backupPath: values['backup-file'] ?? defaultBackupPath(configPath),
    root: values['host-root'] ?? '',
  };
  const dryRun = values['dry-run'] === true;
  const sandboxer = values.sandboxer;
  if (sandboxer !== undefined && (verb !== 'install' || !(SANDBOXERS as readonly string[]).includes(sandboxer))) {
    throw new UsageError(
      verb === 'install'
        ? `--sandboxer must be one of ${SANDBOXERS.join(', ')}, not ${JSON.stringify(sandboxer)}`
        : '--sandboxer is an install option',
    );
  }
  try {
    let plan: InstallPlan;
    if (verb === 'install') {
      const version =
        values['containerd-version'] !== undefined
          ? parseContainerdVersion(values['containerd-version'])
          : await detectContainerdVersion(values['containerd-binary']);
      plan = planInstall({ ...(await gatherInstallInput(paths, version)), sandboxer: (sandboxer ?? 'podsandbox') as Sandboxer });
      io.stdout.write(`kata-ts install: containerd ${formatVersion(version)}, ${configPath}\n`);
    } else {
      plan = planUninstall(await gatherUninstallInput(paths));
    }
    const notes = dryRun ? [] : await executePlan(plan, paths.root);
    print(io, verb, plan, dryRun, notes);
    return 0;
  } catch (err) {
    if (isKataError(err)) {
      io.stderr.write(`kata-ts ${verb}: ${err.message} [${err.reason}]; nothing changed\n`);
      return err.kind === 'invalid' ? 2 : 1;
    }
    throw err;
  }
}

export const runInstallCommand = (argv: string[], io: CliIo): Promise<number> => run('install', argv, io);
export const runUninstallCommand = (argv: string[], io: CliIo): Promise<number> => run('uninstall', argv, io);
