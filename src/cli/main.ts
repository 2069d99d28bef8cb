import { packageVersion } from '../common/paths.js';
import { type CliIo, processIo, UsageError } from './args.js';
import { runBrokerCommand } from './broker.js';
import { runDoctorCommand } from './doctor.js';
import { runInstallCommand, runUninstallCommand } from './install.js';
import { runMetricsCommand } from './metrics.js';
import { runMountNamespaceCommand } from './mount-namespace.js';
import { runPauseCommand, runResumeCommand } from './pause.js';
import { runPlanCommand } from './plan.js';
import { runPsCommand } from './ps.js';
import { runReleaseCommand } from './release.js';
import { runServeCommand } from './serve.js';
import { runTpmCaCommand } from './tpm-ca.js';

const USAGE = `kata-ts: a CRI runtime that runs every pod in its own QEMU virtual machine

Usage: kata-ts <command> [options]

Commands:
  serve            run the CRI daemon on its unix socket
  plan             show how a pod's VM would be shaped, without starting anything
  doctor           check this host: QEMU, acceleration, guest assets, cgroups, systemd, IOMMU
  install          install kata-ts's runtime handlers into containerd's config (--containerd)
  uninstall        remove exactly what install wrote (--containerd)
  mount-namespace  show or remove the runtime's own mount namespace (where its mounts are)
  ps               list the pods kata-ts runs on this node: VM pid, shape, uptime, cgroup
  pause, resume    pause a pod of the daemon (containers frozen, vCPUs stopped) or resume it
  metrics          scrape every pod shim's Prometheus metrics (--shims) as one exposition
  release          install kata-ts on a node as a release, upgrade, roll back, list, prune
  tpm-ca           the node's CA for its vtpm pods' EK certificates: init, rotate, show
  broker           the attestation broker (KBS protocol): init, serve, resource, reference, policy, log
  version          print the version

Run 'kata-ts <command> --help' for a command's options.
`;

type Command = (argv: string[], io: CliIo) => Promise<number>;

const COMMANDS: Record<string, Command> = {
  serve: runServeCommand,
  plan: runPlanCommand,
  doctor: runDoctorCommand,
  'mount-namespace': runMountNamespaceCommand,
  install: runInstallCommand,
  uninstall: runUninstallCommand,
  ps: runPsCommand,
  pause: runPauseCommand,
  resume: runResumeCommand,
  metrics: runMetricsCommand,
  release: runReleaseCommand,
  'tpm-ca': runTpmCaCommand,
  broker: runBrokerCommand,
  version: async (argv, io) => {
    if (argv.includes('--help') || argv.includes('-h')) {
      io.stdout.write('Usage: kata-ts version\n\nPrints the kata-ts version and the CRI API version it speaks.\n');
      return 0;
    }
    if (argv.length > 0) throw new UsageError(`version takes no arguments, got "${argv.join(' ')}"`);
    io.stdout.write(`kata-ts ${packageVersion()} (CRI v1)\n`);
    return 0;
  },
};

/** Entry point: returns the process exit code (0 ok, 1 failure, 2 usage error). */
export async function main(argv: string[], io: CliIo = processIo): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    io.stdout.write(USAGE);
    return name === undefined ? 2 : 0;
  }
  if (name === '--version') return COMMANDS.version!([], io);
  const command = COMMANDS[name];
  if (command === undefined) {
    io.stderr.write(`kata-ts: unknown command "${name}"; commands: ${Object.keys(COMMANDS).join(', ')}\n`);
    return 2;
  }
  try {
    return await command(rest, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.stderr.write(`kata-ts ${name}: ${err.message}\n`);
      return 2;
    }
    io.stderr.write(`kata-ts ${name}: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
}
