/**
 * What `kata-ts doctor` asks of this host about confined VMMs: does QEMU take the seccomp option,
 * is setpriv where the jail finds it. Each runs one short process (argument arrays), changes nothing.
 */
import { spawn } from 'node:child_process';
import { errorMessage } from '../common/errors.js';
import { SETPRIV_BINARY } from './confine.js';

export interface ProbeResult {
  ok: boolean;
  message: string;
}

const PROBE_TIMEOUT_MS = 10_000;

function runWithInput(file: string, args: string[], input: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'], timeout: PROBE_TIMEOUT_MS });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (out += b.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, out }));
    // A program that exits (or never started) before reading its input: its exit says why.
    child.stdin.on('error', () => undefined);
    child.stdin.end(input);
  });
}

/**
 * Start QEMU with no machine and `-sandbox <value>`, then quit it over QMP on stdin: QEMU installs
 * the filter before it reads QMP, and refuses an option group it does not know (or a build without
 * seccomp) at once with a message, which is returned.
 */
export async function probeQemuSandbox(qemuBinary: string, sandbox: string): Promise<ProbeResult> {
  try {
    const { code, out } = await runWithInput(
      qemuBinary,
      ['-machine', 'none', '-nodefaults', '-no-user-config', '-display', 'none', '-sandbox', sandbox, '-qmp', 'stdio'],
      '{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n',
    );
    if (code === 0) return { ok: true, message: `QEMU runs under -sandbox ${sandbox}` };
    const why = out
      .split('\n')
      .filter((l) => l !== '' && !l.startsWith('{'))
      .join(' ');
    return { ok: false, message: `QEMU refuses -sandbox ${sandbox}: ${why || `exit code ${code}`}` };
  } catch (err) {
    return { ok: false, message: `QEMU binary ${qemuBinary} cannot be run: ${errorMessage(err)}` };
  }
}

/** util-linux setpriv at the path the jail runs it from (/usr/bin: inside the jail's /usr). */
export async function probeSetpriv(): Promise<ProbeResult> {
  try {
    const { code, out } = await runWithInput(SETPRIV_BINARY, ['--version'], '');
    if (code === 0) return { ok: true, message: out.trim().split('\n')[0] ?? SETPRIV_BINARY };
    return { ok: false, message: `${SETPRIV_BINARY} --version failed: ${out.trim()}` };
  } catch (err) {
    return { ok: false, message: `${SETPRIV_BINARY} cannot be run (util-linux): ${errorMessage(err)}` };
  }
}

/**
 * kata-ts-jailer (native/jailer.c) at `binary`: built by setup (scripts/build-native.sh). Run with
 * no arguments it prints its usage and exits 125 without touching anything.
 */
export async function probeJailer(binary: string): Promise<ProbeResult> {
  try {
    const { code, out } = await runWithInput(binary, [], '');
    if (code === 125 && out.includes('usage: kata-ts-jailer')) return { ok: true, message: `${binary} is in place` };
    return { ok: false, message: `${binary} did not answer as kata-ts-jailer: ${out.trim() || `exit code ${code}`}` };
  } catch (err) {
    return { ok: false, message: `${binary} cannot be run (build it with scripts/build-native.sh): ${errorMessage(err)}` };
  }
}
