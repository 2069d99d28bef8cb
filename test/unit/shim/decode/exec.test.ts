import { describe, expect, it } from 'vitest';
import { decodeExecProcess } from '../../../../src/shim/decode/index.js';
import { thrown } from '../../../helpers/kata-error.js';

/** What containerd's CRI sends for `crictl exec -it <ctr> sh`: the container's process with args replaced. */
function execProcess(): Record<string, unknown> {
  return {
    user: { uid: 101, gid: 101, additionalGids: [101] },
    args: ['sh', '-c', 'echo hello'],
    env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOSTNAME=web', 'A=b=c'],
    cwd: '/',
    terminal: true,
    consoleSize: { height: 24, width: 80 },
    capabilities: { bounding: ['CAP_CHOWN'], effective: ['CAP_CHOWN'], permitted: ['CAP_CHOWN'] },
    noNewPrivileges: false,
    oomScoreAdj: 968,
    rlimits: [{ type: 'RLIMIT_NOFILE', hard: 1024, soft: 1024 }],
  };
}

describe('decodeExecProcess', () => {
  it('keeps argv, env, cwd, terminal, user and the console size', () => {
    expect(decodeExecProcess(execProcess())).toEqual({
      args: ['sh', '-c', 'echo hello'],
      env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOSTNAME=web', 'A=b=c'],
      cwd: '/',
      terminal: true,
      user: { uid: 101, gid: 101, additionalGids: [101] },
      consoleSize: { height: 24, width: 80 },
    });
  });

  it('has no console size without a terminal, no env or groups when none are given', () => {
    const spec = decodeExecProcess({ user: { uid: 0, gid: 0 }, args: ['true'], cwd: '/', consoleSize: { height: 1, width: 1 } });
    expect(spec).toEqual({ args: ['true'], env: [], cwd: '/', terminal: false, user: { uid: 0, gid: 0, additionalGids: [] } });
  });

  it.each<[string, (p: Record<string, unknown>) => void, string, string]>([
    ['no args', (p) => delete p.args, 'CONTAINER_EXEC_EMPTY', 'spec.args must not be empty'],
    ['empty args', (p) => (p.args = []), 'CONTAINER_EXEC_EMPTY', 'spec.args must not be empty'],
    ['an empty program', (p) => (p.args = ['', 'x']), 'CONTAINER_EXEC_EMPTY', 'spec.args[0] must name a program'],
    ['args that are no list', (p) => (p.args = 'sh'), 'SHIM_SPEC_INVALID', 'spec.args must be array'],
    ['a relative cwd', (p) => (p.cwd = 'tmp'), 'SHIM_SPEC_INVALID', 'spec.cwd is "tmp", not an absolute path'],
    ['no cwd', (p) => delete p.cwd, 'SHIM_SPEC_INVALID', "process spec must have required property 'cwd'"],
    ['no user', (p) => delete p.user, 'SHIM_SPEC_INVALID', "process spec must have required property 'user'"],
    ['a uid that is no number', (p) => (p.user = { uid: '0', gid: 0 }), 'SHIM_SPEC_INVALID', 'spec.user.uid must be integer'],
    ['an env entry without "="', (p) => (p.env = ['PATH']), 'SHIM_ENV_INVALID', 'spec.env[0] is not KEY=VALUE'],
    ['a terminal that is no boolean', (p) => (p.terminal = 'yes'), 'SHIM_SPEC_INVALID', 'spec.terminal must be boolean'],
  ])('refuses %s', (_what, edit, reason, start) => {
    const p = execProcess();
    edit(p);
    const err = thrown(() => decodeExecProcess(p));
    expect(err.kind).toBe('invalid');
    expect(err.reason).toBe(reason);
    expect(err.message.startsWith(start), err.message).toBe(true);
  });

  it.each([null, 'sh', ['sh']])('refuses a process that is not an object: %j', (value) => {
    const err = thrown(() => decodeExecProcess(value));
    expect(err.reason).toBe('SHIM_SPEC_INVALID');
    expect(err.message).toMatch(/^process spec must be object/);
  });
});
