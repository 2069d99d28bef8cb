/**
 * `kata-ts broker serve` inside a test's node network namespace (test/helpers/network-node.ts),
 * listening on the CNI bridge's gateway address, which is how a pod's guest reaches it. The bridge
 * is made first with that address (the bridge plugin takes an existing bridge as it is), so the
 * broker can listen before any pod boots. Its certificate is made by `kata-ts broker init` for that
 * address; its EK CA trust is the daemon's `tpm-ca` dir. vitest-free, so that benches share it.
 *
 * stop() ends the broker by its pid (checked against its start time), waiting for its exit; safe to
 * call twice. The state dir is the caller's (under the daemon's temp dir, removed with it).
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';
import { isSameLiveProcess, readProcStat } from '../../src/common/procfs.js';
import type { NetworkNode } from './network-node.js';
import { until } from './poll.js';
import { scaledMs } from './time-scale.js';

const ROOT = packageRoot();

export interface NodeBroker {
  /** https://<gateway>:<port> */
  url: string;
  /** The broker's certificate (PEM, trimmed): what a pod's initdata trusts. */
  certPem: string;
  dir: string;
  /** Where its stdout and stderr go (a test greps them for what must not be there). */
  stdoutPath: string;
  stderrPath: string;
  stop(): Promise<void>;
}

/** `kata-ts <args>` from this tree; its stdout. */
export function kataTsCli(args: string[]): string {
  return execFileSync(process.execPath, ['--import', 'tsx', 'src/cli/entry.ts', ...args], { cwd: ROOT, encoding: 'utf8' });
}

/** Makes the node's bridge with its gateway address, inits a broker in `dir` and serves it there. */
export async function startNodeBroker(node: NetworkNode, o: { dir: string; tpmCaDir: string; logDir: string }): Promise<NodeBroker> {
  await node.exec(['ip', 'link', 'add', node.bridge, 'type', 'bridge']);
  await node.exec(['ip', 'addr', 'add', `${node.gateway}/24`, 'dev', node.bridge]);
  await node.exec(['ip', 'link', 'set', node.bridge, 'up']);
  const port = 20_000 + (randomBytes(2).readUInt16BE() % 20_000);
  const init = JSON.parse(kataTsCli(['broker', 'init', '--dir', o.dir, '--san', `IP:${node.gateway}`, '--json'])) as { cert: string };
  const certPem = readFileSync(init.cert, 'utf8').trim();
  const stdoutPath = path.join(o.logDir, 'broker.out');
  const stderrPath = path.join(o.logDir, 'broker.err');
  const argv = ['broker', 'serve', '--dir', o.dir, '--listen', `${node.gateway}:${port}`, '--tpm-ca-dir', o.tpmCaDir];
  const child: ChildProcess = spawn(
    'nsenter',
    [`--net=${node.netnsPath}`, '--', process.execPath, '--import', 'tsx', 'src/cli/entry.ts', ...argv],
    {
      cwd: ROOT,
      stdio: ['ignore', openSync(stdoutPath, 'w'), openSync(stderrPath, 'w')],
    },
  );
  const pid = child.pid ?? -1;
  const startTimeTicks = readProcStat(pid)?.startTimeTicks ?? -1;
  const stop = async () => {
    if (startTimeTicks < 0 || !isSameLiveProcess(pid, startTimeTicks)) return;
    process.kill(pid, 'SIGKILL');
    await until('the broker to exit', async () => (child.exitCode !== null || child.signalCode !== null ? true : undefined), 10_000, 50);
  };
  try {
    await until(
      'the broker to listen',
      async () => {
        if (child.exitCode !== null) throw new Error(`broker exited: ${readFileSync(stderrPath, 'utf8')}`);
        return readFileSync(stdoutPath, 'utf8').includes('listening on') ? true : undefined;
      },
      scaledMs(60_000),
      100,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { url: `https://${node.gateway}:${port}`, certPem, dir: o.dir, stdoutPath, stderrPath, stop };
}
