import { describe, expect, it } from 'vitest';
import { bundleSpec, toExitStatus } from '../../../guest/agent/containers/containers.js';
import { parseStatusLine, startFailure } from '../../../guest/agent/containers/reaper.js';
import { RuntimeArgv, rootIsInitramfs } from '../../../guest/agent/containers/runtime.js';

const argv = new RuntimeArgv({ command: ['crun'], stateDir: '/run/crun', cgroupManager: 'cgroupfs' });
const base = ['crun', '--root=/run/crun', '--cgroup-manager=cgroupfs'];

describe('crun argv', () => {
  it('creates with the bundle, pid file and log, and a console socket for a tty', () => {
    expect(argv.create('c1', '/b/c1', '/b/c1/init.pid', '/b/c1/runtime.log')).toEqual([
      ...base,
      '--log=file:/b/c1/runtime.log',
      'create',
      '--bundle=/b/c1',
      '--pid-file=/b/c1/init.pid',
      'c1',
    ]);
    expect(argv.create('c1', '/b', '/p', '/l', '/b/console.sock')).toContain('--console-socket=/b/console.sock');
  });

  it('execs detached with a process file, so the reaper inherits the process', () => {
    expect(argv.exec('c1', '/b/e.json', '/b/e.pid', '/b/e.log', '/b/e.sock')).toEqual([
      ...base,
      '--log=file:/b/e.log',
      'exec',
      '--detach',
      '--process=/b/e.json',
      '--pid-file=/b/e.pid',
      '--tty',
      '--console-socket=/b/e.sock',
      'c1',
    ]);
  });

  it('kills one or all processes by signal number and deletes by force', () => {
    expect(argv.kill('c1', 15, false)).toEqual([...base, 'kill', 'c1', '15']);
    expect(argv.kill('c1', 9, true)).toEqual([...base, 'kill', '--all', 'c1', '9']);
    expect(argv.delete('c1')).toEqual([...base, 'delete', '--force', 'c1']);
  });
});

describe('exit status', () => {
  it('follows the 128 + signal convention and keeps the signal', () => {
    expect(toExitStatus({ kind: 'signal', signal: 9 }, true, 5)).toEqual({ exitCode: 137, signal: 9, oomKilled: true, finishedAtMs: 5 });
    expect(toExitStatus({ kind: 'exit', code: 3 }, false, 6)).toEqual({ exitCode: 3, oomKilled: false, finishedAtMs: 6 });
  });

  it('parses the reaper status lines', () => {
    expect(parseStatusLine('pid 123')).toEqual({ event: 'pid', value: '123' });
    expect(parseStatusLine('error read pid file: No such file')).toEqual({ event: 'error', value: 'read pid file: No such file' });
    expect(parseStatusLine('lost')).toEqual({ event: 'lost', value: '' });
  });

  it('tells a process the request names that cannot run (FAILED_PRECONDITION) from a runtime failure (INTERNAL)', () => {
    const notFound = startFailure('runtime-exit 255', 'executable file `nope` not found in $PATH: No such file or directory\n');
    expect([notFound.kind, notFound.reason, notFound.message]).toEqual([
      'precondition',
      'RUNTIME_PROCESS_NOT_RUNNABLE',
      'The process cannot be started in the container: executable file `nope` not found in $PATH: No such file or directory.',
    ]);
    expect(startFailure('runtime-exit 1', 'chdir to `/nowhere`: No such file or directory').kind).toBe('precondition');
    expect(startFailure('runtime-exit 1', 'open executable: File name too long').kind).toBe('precondition');
    expect(startFailure('runtime-exit 1', 'open executable: Operation not permitted').kind).toBe('precondition');
    expect(startFailure('runtime-exit 1', 'OOM: the memory limit could be too low: write to sync socket: Broken pipe').reason).toBe(
      'RUNTIME_PROCESS_NOT_RUNNABLE',
    );
    const ours = startFailure('runtime-exit 1', 'cannot open cgroup: Read-only file system\n');
    expect([ours.kind, ours.reason, ours.message]).toEqual([
      'internal',
      'RUNTIME_START_FAILED',
      'The OCI runtime could not start the process: cannot open cgroup: Read-only file system.',
    ]);
    expect(startFailure('error spawn', '').message).toBe('The OCI runtime could not start the process.');
  });
});

describe('bundle spec', () => {
  it('points root at the guest rootfs, keeps readonly, and sets the terminal as asked', () => {
    const spec = { process: { args: ['sh'], cwd: '/', terminal: false }, root: { path: 'rootfs', readonly: true } };
    expect(bundleSpec(spec, '/run/kata-ts/shared/c1/rootfs', { tty: true, stdin: true })).toMatchObject({
      root: { path: '/run/kata-ts/shared/c1/rootfs', readonly: true },
      process: { terminal: true },
    });
  });

  it('refuses a spec without a process', () => {
    expect(() => bundleSpec({}, '/r', { tty: false, stdin: false })).toThrow(expect.objectContaining({ reason: 'SPEC_PROCESS_MISSING' }));
  });
});

describe('pivot_root availability', () => {
  it('detects an initramfs root from mountinfo, and a normal root', () => {
    expect(rootIsInitramfs('1 0 0:2 / / rw - rootfs rootfs rw,size=499876k\n22 1 0:21 / /proc rw,relatime - proc proc rw\n')).toBe(true);
    expect(rootIsInitramfs('24 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n')).toBe(false);
    expect(rootIsInitramfs('')).toBe(false);
  });

  it('adds --no-pivot to create only when asked', () => {
    const noPivot = new RuntimeArgv({ command: ['crun'], stateDir: '/run/crun', cgroupManager: 'cgroupfs', noPivot: true });
    expect(noPivot.create('c1', '/b', '/p', '/l')).toContain('--no-pivot');
    expect(argv.create('c1', '/b', '/p', '/l')).not.toContain('--no-pivot');
  });
});
