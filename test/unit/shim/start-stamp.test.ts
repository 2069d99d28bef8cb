import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { DEFAULT_CONFIG_PATH, DEFAULT_SHIM_STATE_ROOT } from '../../../src/config/defaults.js';
import { loadConfig } from '../../../src/config/load.js';
import { CRI_CONTAINER_TYPE, CRI_SANDBOX_ID, CRIO_CONTAINER_TYPE, CRIO_SANDBOX_ID } from '../../../src/shim/bundle.js';
import { MAX_SOCKET_PATH_BYTES, SOCKET_DIR } from '../../../src/shim/paths.js';
import {
  configIdentity,
  loadStampedConfig,
  recordStartStamp,
  START_STAMP_FILE,
  START_STAMP_MAGIC,
  startStampText,
} from '../../../src/shim/start-stamp.js';

const identity = { dev: 65024n, ino: 2155233n, size: 247n, mtimeNs: 1795958007_290676325n, ctimeNs: 1795958007_000000005n };

describe('startStampText', () => {
  it('names the code tree, the config, its identity with nanoseconds in nine digits, and the state root', () => {
    expect(startStampText('/opt/kata-ts/releases/r1', '/etc/kata-ts/config.json', identity, '/run/kata-ts/shim')).toBe(
      `${START_STAMP_MAGIC}\ncode /opt/kata-ts/releases/r1\nconfig /etc/kata-ts/config.json\nidentity 65024 2155233 247 1795958007.290676325 1795958007.000000005\nstateRoot /run/kata-ts/shim\n`,
    );
  });

  it('says "-" for no config file (the built-in defaults)', () => {
    expect(startStampText('/work/kata-ts', null, null, '/run/kata-ts/shim')).toBe(
      `${START_STAMP_MAGIC}\ncode /work/kata-ts\nconfig -\nstateRoot /run/kata-ts/shim\n`,
    );
  });

  it('writes no stamp for a path with a newline (the stamp is line-based)', () => {
    expect(startStampText('/r', '/etc/a\nb.json', identity, '/run/kata-ts/shim')).toBeNull();
    expect(startStampText('/r', '/etc/a.json', identity, '/run/x\ny')).toBeNull();
    expect(startStampText('/r\ns', '/etc/a.json', identity, '/run/x')).toBeNull();
  });
});

describe('native/shim-start.c agrees with the TypeScript it stands in for', () => {
  const c = readFileSync(path.join(packageRoot(), 'native', 'shim-start.c'), 'utf8');
  const define = (name: string): string | undefined => new RegExp(`^#define ${name} (.+)$`, 'm').exec(c)?.[1];

  it('the stamp, the defaults and the socket limit', () => {
    expect(define('STAMP_MAGIC')).toBe(JSON.stringify(START_STAMP_MAGIC));
    expect(define('STAMP_FILE')).toBe(JSON.stringify(START_STAMP_FILE));
    expect(define('DEFAULT_CONFIG_PATH')).toBe(JSON.stringify(DEFAULT_CONFIG_PATH));
    expect(define('DEFAULT_STATE_ROOT')).toBe(JSON.stringify(DEFAULT_SHIM_STATE_ROOT));
    expect(define('MAX_SOCKET_PATH_BYTES')).toBe(String(MAX_SOCKET_PATH_BYTES));
    expect(c).toContain(`"%s/${SOCKET_DIR}/%s", state_root, digest`);
  });

  it('the four annotations, in the order taskRole prefers them', () => {
    const names = /annotation_names\[ANNOTATIONS\] = \{([^}]*)\}/.exec(c)?.[1]?.match(/"[^"]+"/g);
    expect(names).toEqual([CRI_CONTAINER_TYPE, CRIO_CONTAINER_TYPE, CRI_SANDBOX_ID, CRIO_SANDBOX_ID].map((n) => JSON.stringify(n)));
  });
});

describe('loadStampedConfig: the config a start of this code stamped, unchanged, without the schema again', () => {
  let dir = '';
  afterEach(async () => {
    if (dir !== '') await fsp.rm(dir, { recursive: true, force: true });
  });

  it('is the config loadConfig gives, only while the stamp names the file as it is and this code tree', async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-stamp-'));
    const stateRoot = path.join(dir, 'state');
    const file = path.join(dir, 'config.json');
    await fsp.mkdir(stateRoot);
    await fsp.writeFile(file, JSON.stringify({ logLevel: 'warn', shim: { stateRoot, mode: 'node' } }));
    expect(await loadStampedConfig(file)).toBeUndefined(); // no stamp yet

    await recordStartStamp(stateRoot, file, configIdentity(file));
    const stamped = await loadStampedConfig(file);
    expect(stamped).toEqual(await loadConfig(file));
    expect(stamped?.config.shim.mode).toBe('node');

    // Another tree's stamp: not trusted.
    const stampFile = path.join(stateRoot, START_STAMP_FILE);
    const text = await fsp.readFile(stampFile, 'utf8');
    await fsp.writeFile(stampFile, text.replace(/\ncode [^\n]*\n/, '\ncode /elsewhere\n'));
    expect(await loadStampedConfig(file)).toBeUndefined();
    await fsp.writeFile(stampFile, text);
    expect(await loadStampedConfig(file)).toBeDefined();

    // The same bytes written again: the ctime moved, the file is judged again.
    await fsp.writeFile(file, await fsp.readFile(file));
    expect(await loadStampedConfig(file)).toBeUndefined();
    // An identity taken before an edit stamps nothing.
    const before = configIdentity(file);
    await fsp.writeFile(file, JSON.stringify({ shim: { stateRoot } }));
    await recordStartStamp(stateRoot, file, before);
    expect(await loadStampedConfig(file)).toBeUndefined();
    expect(await loadStampedConfig(path.join(dir, 'missing.json'))).toBeUndefined();
  });
});
