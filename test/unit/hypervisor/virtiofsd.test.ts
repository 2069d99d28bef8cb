import { describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { buildVirtiofsdArgv } from '../../../src/hypervisor/virtiofsd.js';

function thrown(fn: () => unknown): KataError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    return err as KataError;
  }
  throw new Error('expected a KataError');
}

describe('buildVirtiofsdArgv', () => {
  it('shares the source directory on the socket, sandboxed, with cache=auto unless told', () => {
    expect(
      buildVirtiofsdArgv({ socketPath: '/run/kata-ts/vm/S/virtiofsd.sock', sourceDir: '/var/lib/kata-ts/sandboxes/S/shared' }),
    ).toEqual([
      '--socket-path=/run/kata-ts/vm/S/virtiofsd.sock',
      '-o',
      'source=/var/lib/kata-ts/sandboxes/S/shared',
      '-o',
      'cache=auto',
      '-o',
      'sandbox=namespace',
      '-o',
      'log_level=warn',
    ]);
    expect(buildVirtiofsdArgv({ socketPath: '/s.sock', sourceDir: '/d', cache: 'none' })).toContain('cache=none');
  });

  it('refuses relative paths and commas (virtiofsd cannot escape them), naming the field', () => {
    const relative = thrown(() => buildVirtiofsdArgv({ socketPath: 'v.sock', sourceDir: '/d' }));
    expect(relative).toMatchObject({ kind: 'invalid', reason: 'VIRTIOFSD_PATH_INVALID' });
    expect(relative.message).toContain('socketPath');
    const comma = thrown(() => buildVirtiofsdArgv({ socketPath: '/v.sock', sourceDir: '/a,b' }));
    expect(comma.message).toContain('sourceDir');
  });

  it('refuses a socket path longer than sun_path', () => {
    const err = thrown(() => buildVirtiofsdArgv({ socketPath: `/run/${'x'.repeat(110)}.sock`, sourceDir: '/d' }));
    expect(err).toMatchObject({ reason: 'UNIX_SOCKET_PATH_TOO_LONG' });
  });
});
