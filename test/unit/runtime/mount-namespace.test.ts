/**
 * The pure parts of the runtime's mount namespace: the marker, the mount table's fields this
 * module reads, and the command line that starts a program inside (nsenter, then env -C, the
 * program's argv untouched after "--"). The namespace itself: test/integration/sandbox/mount-namespace.test.ts.
 */
import { describe, expect, it } from 'vitest';
import {
  formatNamespaceId,
  insideCommand,
  MOUNT_NAMESPACE_ENV,
  namespaceOf,
  parseMountEntries,
  parseNamespaceId,
  placeInNamespace,
  sameNamespace,
} from '../../../src/runtime/mount-namespace.js';
import { rejection } from '../../helpers/kata-error.js';

describe('the mount namespace marker', () => {
  it('round-trips <dev>:<ino> and refuses anything else', () => {
    const id = { dev: 4, ino: 4026532177 };
    expect(formatNamespaceId(id)).toBe('4:4026532177');
    expect(parseNamespaceId('4:4026532177')).toEqual(id);
    expect(sameNamespace(parseNamespaceId('4:4026532177')!, id)).toBe(true);
    for (const bad of ['', '4', 'mnt:[4026532177]', '4:x', ' 4:1']) expect(parseNamespaceId(bad)).toBeUndefined();
  });

  it('a marker naming this process namespace means inside; one naming another throws rather than loop', async () => {
    const own = namespaceOf()!;
    expect(await placeInNamespace('/nonexistent/ns/mnt', { [MOUNT_NAMESPACE_ENV]: formatNamespaceId(own) })).toBe('inside');
    expect(await placeInNamespace('/nonexistent/ns/mnt', {})).toBe('outside');
    const err = await rejection(
      placeInNamespace('/nonexistent/ns/mnt', { [MOUNT_NAMESPACE_ENV]: formatNamespaceId({ dev: own.dev, ino: own.ino + 1 }) }),
    );
    expect([err.kind, err.reason]).toEqual(['internal', 'MOUNT_NAMESPACE_NOT_ENTERED']);
  });
});

describe('parseMountEntries', () => {
  it('reads ids, device, root, mount point (escapes decoded) and shared propagation', () => {
    const text = [
      '27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw',
      '43 27 254:0 /tmp/a\\040b /tmp/a\\040b rw,relatime - ext4 /dev/vda rw',
      '44 27 0:39 / /run rw master:3 shared:7 - tmpfs tmpfs rw',
      'garbage',
      '',
    ].join('\n');
    expect(parseMountEntries(text)).toEqual([
      { id: '27', parent: '1', dev: '254:0', root: '/', point: '/', shared: true },
      { id: '43', parent: '27', dev: '254:0', root: '/tmp/a b', point: '/tmp/a b', shared: false },
      { id: '44', parent: '27', dev: '0:39', root: '/', point: '/run', shared: true },
    ]);
  });
});

describe('insideCommand', () => {
  const id = { dev: 4, ino: 4026532177 };
  const self = { command: '/usr/bin/node', args: ['--import', 'tsx', '/k/src/cli/entry.ts', 'serve', '--config', '/c -x.json'] };

  it('nsenter into the file, env -C back to the working directory, the program argv whole, the marker in its environment', () => {
    expect(insideCommand('/run/kata-ts/ns/mnt', id, '/work dir', self, false)).toEqual({
      command: 'nsenter',
      args: ['--mount=/run/kata-ts/ns/mnt', '--', 'env', '-C', '/work dir', '--', ...[self.command, ...self.args]],
      env: { [MOUNT_NAMESPACE_ENV]: '4:4026532177' },
    });
  });

  it('a child that must die with its parent goes through setpriv --pdeathsig KILL', () => {
    const cmd = insideCommand('/run/kata-ts/ns/mnt', id, '/', self, true);
    expect(cmd.command).toBe('setpriv');
    expect(cmd.args.slice(0, 5)).toEqual(['--pdeathsig', 'KILL', '--', 'nsenter', '--mount=/run/kata-ts/ns/mnt']);
  });
});
