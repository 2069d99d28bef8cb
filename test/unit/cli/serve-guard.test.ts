/**
 * `kata-ts serve` outlives a rejected promise nobody awaited (one pod's background work): the
 * error is logged and the process goes on. Checked in a child process of its own, as Node would
 * otherwise end it (vitest, in this one, would report the rejection instead).
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';

const run = promisify(execFile);

const CHILD = `
import { createLogger } from './src/common/logger.ts';
import { guardUnhandledRejections } from './src/cli/serve.ts';
const guarded = process.argv.includes('guarded');
if (guarded) guardUnhandledRejections(createLogger({ level: 'info' }));
void Promise.reject(new Error('one pod went wrong'));
setTimeout(() => process.stdout.write('still serving\\n'), 100);
`;

async function child(mode: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', CHILD, mode], { cwd: packageRoot() }).then(
    (r) => ({ code: 0, ...r }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

describe('guardUnhandledRejections', () => {
  it('guarded: the rejection is logged at error level and the process keeps running; unguarded, Node ends it (the control)', async () => {
    const guarded = await child('guarded');
    expect(guarded.code).toBe(0);
    expect(guarded.stdout).toContain('still serving');
    const line = (guarded.stdout + guarded.stderr).split('\n').find((l) => l.includes('unhandled rejection'));
    expect(JSON.parse(line!)).toMatchObject({
      level: 'error',
      err: 'one pod went wrong',
      msg: 'unhandled rejection (the daemon keeps serving)',
    });
    const bare = await child('bare');
    expect(bare.code).not.toBe(0);
    expect(bare.stdout).not.toContain('still serving');
  }, 30_000);
});
