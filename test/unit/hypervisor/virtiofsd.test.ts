import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { KataError } from '../../../src/common/errors.js';
import { silentLogger } from '../../../src/common/logger.js';
import { buildVirtiofsdArgv, startVirtiofsd } from '../../../src/hypervisor/virtiofsd.js';
import { thrown } from '../../helpers/kata-error.js';

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
      'modcaps=-mknod:-setfcap',
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

describe('startVirtiofsd failures (stand-in binaries, no QEMU)', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'vfsd-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const script = (name: string, body: string): string => {
    const file = path.join(dir, name);
    writeFileSync(file, `#!/bin/sh\n${body}\n`);
    chmodSync(file, 0o755);
    return file;
  };
  const options = (binary: string) => ({
    binary,
    socketPath: path.join(dir, 'v.sock'),
    sourceDir: dir,
    logFile: path.join(dir, 'virtiofsd.log'),
    logger: silentLogger(),
  });

  it('reports a virtiofsd that exits before listening, with its output', async () => {
    const err = await startVirtiofsd(options(script('dies', 'echo "fuse: bad mount point" >&2; exit 1'))).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'unavailable', reason: 'VIRTIOFSD_EXITED' });
    expect((err as KataError).message).toContain('fuse: bad mount point');
  });

  it('kills a virtiofsd that never listens, by pid, and says so', async () => {
    const pidFile = path.join(dir, 'pid');
    const binary = script('hangs', `echo $$ > ${pidFile}; exec sleep 30`);
    const err = await startVirtiofsd({ ...options(binary), startTimeoutMs: 300 }).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'timeout', reason: 'VIRTIOFSD_START_TIMEOUT' });
    const pid = Number(readFileSync(pidFile, 'utf8'));
    // Gone (reaped, or at most a zombie until node reaps it): never left running.
    const state = (): string | undefined => {
      try {
        return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
      } catch {
        return undefined;
      }
    };
    expect([undefined, 'Z']).toContain(state());
  });
});
