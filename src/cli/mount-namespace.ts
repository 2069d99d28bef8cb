import { readFileSync } from 'node:fs';
import {
  boundNamespace,
  type NamespaceRemoval,
  namespaceOf,
  processesInNamespace,
  removeMountNamespace,
  sameNamespace,
} from '../runtime/mount-namespace.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';
import { loadWithOverrides } from './serve.js';

const HELP = `Usage: kata-ts mount-namespace [status|remove] [--config FILE]

The runtime's own mount namespace, bound at mountNamespacePath (/run/kata-ts/ns/mnt by default):
'kata-ts serve' and the containerd shim make their mounts there, out of the host's mount table
(docs/architecture.md). It is created when a daemon or shim first needs it and kept across their
restarts, so that they find their mounts again.

  status  (the default) where it is bound and which processes are in it
  remove  let it go with every mount in it, when no process is in it any more (no daemon, shim,
          pod VM or virtiofsd); otherwise nothing changes, the processes are named and the exit
          code is 1. Look inside with: nsenter --mount=<path> findmnt
`;

function comm(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '?';
  }
}

const describe = (pids: readonly number[]) => pids.map((p) => `${p} (${comm(p)})`).join(', ');

export async function runMountNamespaceCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, { config: { type: 'string' }, help: { type: 'boolean', short: 'h' } }, true);
  if (values.help === true) {
    io.stdout.write(HELP);
    return 0;
  }
  const action = positionals[0] ?? 'status';
  if (positionals.length > 1 || (action !== 'status' && action !== 'remove'))
    throw new UsageError(`expected status or remove, got "${positionals.join(' ')}"`);
  const { config } = await loadWithOverrides(values);
  const file = config.mountNamespacePath;
  if (file === null) {
    io.stdout.write('mountNamespacePath is null: kata-ts makes its mounts in the namespace it is started in\n');
    return 0;
  }
  if (action === 'remove') {
    const result: NamespaceRemoval = await removeMountNamespace(file);
    if (result.users.length > 0) {
      io.stderr.write(
        `kata-ts mount-namespace: ${file} is in use by ${result.users.length} process(es), left as it is: ${describe(result.users)}\n`,
      );
      return 1;
    }
    io.stdout.write(result.removed ? `${file}: removed\n` : `${file}: no mount namespace was bound there\n`);
    return 0;
  }
  const id = await boundNamespace(file);
  if (id === undefined) {
    io.stdout.write(`${file}: not created yet (the next 'kata-ts serve' or shim start creates it)\n`);
    return 0;
  }
  const own = namespaceOf();
  const users = processesInNamespace(id);
  io.stdout.write(
    `${file}: mnt:[${id.ino}]${own !== undefined && sameNamespace(own, id) ? ' (this process is in it)' : ''}, ${users.length} process(es) in it${users.length > 0 ? `: ${describe(users)}` : ''}\n`,
  );
  return 0;
}
