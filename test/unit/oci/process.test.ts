import { describe, expect, it } from 'vitest';
import { DEFAULT_PATH, mergeEnv, resolveArgs, resolveCwd, resolveStopSignal } from '../../../src/oci/process.js';
import { thrown } from './load.js';

const image = { Entrypoint: ['/entry'], Cmd: ['default-arg'] };

describe('args: Kubernetes command/args against the image Entrypoint/Cmd', () => {
  it('neither: Entrypoint + Cmd', () => {
    expect(resolveArgs({}, image)).toEqual(['/entry', 'default-arg']);
  });
  it('command replaces the Entrypoint and drops Cmd', () => {
    expect(resolveArgs({ command: ['/bin/app'] }, image)).toEqual(['/bin/app']);
  });
  it('command + args', () => {
    expect(resolveArgs({ command: ['/bin/app'], args: ['-v'] }, image)).toEqual(['/bin/app', '-v']);
  });
  it('args alone replace Cmd and keep the Entrypoint', () => {
    expect(resolveArgs({ args: ['x', 'y'] }, image)).toEqual(['/entry', 'x', 'y']);
  });
  it('args alone with no Entrypoint run the args', () => {
    expect(resolveArgs({ args: ['/bin/sh', '-c', 'true'] }, { Cmd: ['ignored'] })).toEqual(['/bin/sh', '-c', 'true']);
  });
  it('an image with only Cmd', () => {
    expect(resolveArgs({}, { Cmd: ['sh'], Entrypoint: null })).toEqual(['sh']);
  });
  it('an empty result is refused naming command', () => {
    const err = thrown(() => resolveArgs({}, {}));
    expect(err.reason).toBe('OCI_NO_COMMAND');
    expect(err.kind).toBe('invalid');
    expect(err.message).toMatch(/^container\.command /);
    expect(thrown(() => resolveArgs({}, null)).reason).toBe('OCI_NO_COMMAND');
    expect(thrown(() => resolveArgs({ command: [''] }, null)).reason).toBe('OCI_NO_COMMAND');
  });
  it('a NUL byte is refused naming the element', () => {
    const err = thrown(() => resolveArgs({ command: ['/bin/app', 'a\0b'] }, null));
    expect(err.reason).toBe('OCI_NUL_IN_STRING');
    expect(err.message).toMatch(/^container\.command\[1\]/);
  });
  it('shell metacharacters are passed as one argument each, never interpreted', () => {
    expect(resolveArgs({ command: ['echo', '$(id); rm -rf / | cat'] }, null)).toEqual(['echo', '$(id); rm -rf / | cat']);
  });
});

describe('env', () => {
  it('request wins in place; new keys appended in request order', () => {
    const env = mergeEnv(
      {
        envs: [
          { key: 'B', value: 'req' },
          { key: 'Z', value: '1' },
          { key: 'A', value: 'x=y' },
        ],
      },
      { Env: ['PATH=/bin', 'A=img', 'B=img', 'C=img'] },
      {},
    );
    expect(env).toEqual(['PATH=/bin', 'A=x=y', 'B=req', 'C=img', 'Z=1']);
  });
  it('a default PATH when nobody sets one, HOSTNAME, TERM with a tty, HOME unless set', () => {
    expect(mergeEnv({ tty: true }, null, { hostname: 'h', home: '/root' })).toEqual([
      `PATH=${DEFAULT_PATH}`,
      'HOSTNAME=h',
      'TERM=xterm',
      'HOME=/root',
    ]);
    expect(mergeEnv({ envs: [{ key: 'HOME', value: '/x' }] }, null, { home: '/root' })).toEqual([`PATH=${DEFAULT_PATH}`, 'HOME=/x']);
    expect(mergeEnv({ envs: [{ key: 'PATH', value: '/p' }] }, null, {})).toEqual(['PATH=/p']);
  });
  it('the request may override HOSTNAME and TERM', () => {
    const env = mergeEnv({ tty: true, envs: [{ key: 'TERM', value: 'dumb' }] }, null, { hostname: 'h' });
    expect(env).toContain('TERM=dumb');
    expect(env).not.toContain('TERM=xterm');
  });
  it('an image entry without "=" is a key with an empty value', () => {
    expect(mergeEnv({}, { Env: ['PATH=/bin', 'FLAG'] }, {})).toEqual(['PATH=/bin', 'FLAG=']);
  });
  it('a bad key is refused naming it', () => {
    for (const key of ['', 'A=B']) {
      const err = thrown(() =>
        mergeEnv(
          {
            envs: [
              { key: 'OK', value: '' },
              { key, value: 'v' },
            ],
          },
          null,
          {},
        ),
      );
      expect(err.reason).toBe('OCI_ENV_INVALID');
      expect(err.message).toMatch(/^container\.envs\[1\]\.key/);
    }
  });
});

describe('working dir and stop signal', () => {
  it('request, else image, else /', () => {
    expect(resolveCwd({ working_dir: '/req' }, { WorkingDir: '/img' })).toBe('/req');
    expect(resolveCwd({ working_dir: '' }, { WorkingDir: '/img' })).toBe('/img');
    expect(resolveCwd({}, {})).toBe('/');
    expect(resolveCwd({}, null)).toBe('/');
  });
  it('a relative directory is refused naming where it came from', () => {
    expect(thrown(() => resolveCwd({ working_dir: 'app' }, null)).message).toMatch(/^container\.working_dir/);
    expect(thrown(() => resolveCwd({}, { WorkingDir: 'app' })).message).toMatch(/^image\.WorkingDir/);
  });
  it('request, else image (normalised), else SIGTERM', () => {
    expect(resolveStopSignal({ stop_signal: 'SIGINT' }, { StopSignal: 'SIGQUIT' })).toBe('SIGINT');
    expect(resolveStopSignal({ stop_signal: 'RUNTIME_DEFAULT' }, { StopSignal: 'quit' })).toBe('SIGQUIT');
    expect(resolveStopSignal({}, { StopSignal: '9' })).toBe('9');
    expect(resolveStopSignal({}, null)).toBe('SIGTERM');
  });
});
