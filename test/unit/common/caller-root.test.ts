import {
  closeSync,
  constants,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { adoptCallerRoot, CALLER_ROOT_ENV, callerPath, callerRootLink, pathInRoot } from '../../../src/common/caller-root.js';

/** A readlink over a table of links (path under the root -> target); anything else is no link. */
const links = (table: Record<string, string>) => (p: string) => table[p] ?? null;

describe('pathInRoot (pure)', () => {
  const R = '/proc/42/fd/7';

  it('names a plain path under the root', () => {
    expect(pathInRoot(R, '/var/lib/x/netns/cni-1', links({}))).toBe(`${R}/var/lib/x/netns/cni-1`);
    expect(pathInRoot(R, '/', links({}))).toBe(R);
  });

  it("resolves an absolute link inside the caller's root, not ours (/var/run -> /run)", () => {
    expect(pathInRoot(R, '/var/run/netns/cni-1', links({ [`${R}/var/run`]: '/run' }))).toBe(`${R}/run/netns/cni-1`);
  });

  it('resolves a relative link from its directory, and links of links', () => {
    const table = { [`${R}/a/b`]: '../c/d', [`${R}/c/d`]: '/e' };
    expect(pathInRoot(R, '/a/b/f', links(table))).toBe(`${R}/e/f`);
  });

  it('never climbs above the root (.. at the root stays there)', () => {
    expect(pathInRoot(R, '/../../etc/./passwd', links({}))).toBe(`${R}/etc/passwd`);
    expect(pathInRoot(R, '/a/x', links({ [`${R}/a`]: '../../../b' }))).toBe(`${R}/b/x`);
  });

  it('refuses a relative path and a loop of links, naming the path', () => {
    expect(() => pathInRoot(R, 'run/netns/x', links({}))).toThrow(expect.objectContaining({ reason: 'CALLER_PATH_INVALID' }));
    expect(() => pathInRoot(R, '/loop/x', links({ [`${R}/loop`]: '/loop' }))).toThrow(
      expect.objectContaining({ reason: 'CALLER_PATH_INVALID', details: { path: '/loop/x' } }),
    );
  });
});

describe('adoptCallerRoot and callerPath (a directory standing for the caller root)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-caller-root-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('without the environment entry nothing is adopted and paths stay as they are', () => {
    adoptCallerRoot({});
    expect(callerRootLink()).toBeNull();
    expect(callerPath('/no/such/caller/path')).toBe('/no/such/caller/path');
  });

  it("adopts a close-on-exec copy, closes the inherited descriptor, drops the entry; names the caller's files through it", () => {
    const root = path.join(dir, 'root');
    mkdirSync(path.join(root, 'run', 'netns'), { recursive: true });
    mkdirSync(path.join(root, 'var'));
    symlinkSync('/run', path.join(root, 'var', 'run'));
    writeFileSync(path.join(root, 'run', 'netns', 'only-there'), 'caller\n');
    const inherited = openSync(root, constants.O_RDONLY | constants.O_DIRECTORY);
    const env: NodeJS.ProcessEnv = { [CALLER_ROOT_ENV]: String(inherited) };
    adoptCallerRoot(env);
    expect(env[CALLER_ROOT_ENV]).toBeUndefined();
    expect(existsSync(`/proc/self/fd/${inherited}`)).toBe(false);
    const link = callerRootLink();
    expect(link).toMatch(new RegExp(`^/proc/${process.pid}/fd/[0-9]+$`));
    const flags = Number.parseInt(/^flags:\s*([0-7]+)/m.exec(readFileSync(`/proc/self/fdinfo/${link!.split('/').at(-1)}`, 'utf8'))![1]!, 8);
    expect(flags & 0o2000000).not.toBe(0);
    // Not in this namespace's /run: named through the caller's root, the link /var/run resolved there.
    const p = callerPath('/var/run/netns/only-there');
    expect(p).toBe(`${link}/run/netns/only-there`);
    expect(readFileSync(p, 'utf8')).toBe('caller\n');
    // /proc is the same for both, a relative path is the working directory's: as they are.
    expect(callerPath('/proc/1/ns/net')).toBe('/proc/1/ns/net');
    expect(callerPath('run/netns/only-there')).toBe('run/netns/only-there');
    closeSync(Number(link!.split('/').at(-1)));
  });

  it('keeps a path that names the very same file here (a shared root)', () => {
    const inherited = openSync('/', constants.O_RDONLY | constants.O_DIRECTORY);
    adoptCallerRoot({ [CALLER_ROOT_ENV]: String(inherited) });
    const file = path.join(dir, 'same');
    writeFileSync(file, 'x');
    expect(callerPath(file)).toBe(file);
    // A path that exists nowhere is named through the root (whoever opens it hears ENOENT there).
    expect(callerPath(path.join(dir, 'missing'))).toBe(`${callerRootLink()}${path.join(dir, 'missing')}`);
  });

  it('refuses a descriptor that is not an open directory', () => {
    const file = path.join(dir, 'plain');
    writeFileSync(file, 'x');
    const fd = openSync(file, 'r');
    expect(() => adoptCallerRoot({ [CALLER_ROOT_ENV]: String(fd) })).toThrow(expect.objectContaining({ reason: 'CALLER_ROOT_INVALID' }));
    closeSync(fd);
    expect(() => adoptCallerRoot({ [CALLER_ROOT_ENV]: 'x' })).toThrow(expect.objectContaining({ reason: 'CALLER_ROOT_INVALID' }));
  });
});
