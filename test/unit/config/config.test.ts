import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { resolveHandler } from '../../../src/config/handlers.js';
import { loadConfig, parseConfigDocument } from '../../../src/config/load.js';

function problemsOf(fn: () => unknown): string[] {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    const e = err as KataError;
    expect(e.kind).toBe('invalid');
    expect(e.reason).toBe('CONFIG_INVALID');
    return (e.details?.problems as string[]) ?? [];
  }
  throw new Error('expected the config to be refused');
}

describe('config file', () => {
  it('an empty document gives the built-in defaults', () => {
    expect(parseConfigDocument({}, 'test')).toEqual(defaultConfig());
  });

  it('rejects unknown keys with the JSON pointer of each', () => {
    const problems = problemsOf(() =>
      parseConfigDocument({ socketpath: '/x', hypervisor: { qemuBin: 'q' }, handlers: { 'kata-ts': { vm: { cpus: 2 } } } }, 'test'),
    );
    expect(problems).toEqual(
      expect.arrayContaining([
        '/socketpath is not a known key',
        '/hypervisor/qemuBin is not a known key',
        '/handlers/kata-ts/vm/cpus is not a known key',
      ]),
    );
  });

  it('rejects wrong types and enum values, naming the key', () => {
    const problems = problemsOf(() =>
      parseConfigDocument({ cgroupDriver: 'cgroupv2', stateDir: 'relative/dir', hypervisor: { readyTimeoutMs: -5 } }, 'test'),
    );
    expect(problems.some((p) => p.startsWith('/cgroupDriver must be one of "auto", "systemd", "cgroupfs"'))).toBe(true);
    expect(problems.some((p) => p.startsWith('/stateDir '))).toBe(true);
    expect(problems.some((p) => p.startsWith('/hypervisor/readyTimeoutMs '))).toBe(true);
  });

  it('pool.claimTimeoutMs: 30 s by default, a whole number of ms from 1 s to 10 min', () => {
    expect(defaultConfig().pool.claimTimeoutMs).toBe(30_000);
    expect(parseConfigDocument({ pool: { claimTimeoutMs: 5000 } }, 'test').pool.claimTimeoutMs).toBe(5000);
    for (const bad of [999, 600_001, 1.5, '30s']) {
      const problems = problemsOf(() => parseConfigDocument({ pool: { claimTimeoutMs: bad } }, 'test'));
      expect(problems.some((p) => p.startsWith('/pool/claimTimeoutMs '))).toBe(true);
    }
  });

  it('a handler entry overlays the built-in profile of its name; a new name starts from kata-ts', () => {
    const config = parseConfigDocument(
      { handlers: { 'kata-ts': { vm: { maxVcpus: 8 } }, 'kata-ts-gpu': { pcie: { portType: 'switch-port' } } } },
      'test',
    );
    const base = defaultConfig().handlers['kata-ts']!;
    expect(config.handlers['kata-ts']!.vm).toEqual({ ...base.vm, maxVcpus: 8 });
    expect(config.handlers['kata-ts-gpu']!.pcie).toEqual({ ...base.pcie, portType: 'switch-port' });
    expect(config.handlers['kata-ts-cvm']!.confidential).toBe(true);
  });

  it('free page reporting is on for kata-ts and off for kata-ts-cvm by default', () => {
    const config = parseConfigDocument({}, 'test');
    expect(config.handlers['kata-ts']!.vm.freePageReporting).toBe(true);
    expect(config.handlers['kata-ts-cvm']!.vm.freePageReporting).toBe(false);
    expect(
      parseConfigDocument({ handlers: { 'kata-ts': { vm: { freePageReporting: false } } } }, 'test').handlers['kata-ts']!.vm,
    ).toMatchObject({ freePageReporting: false });
  });

  it('cross-field rules report every problem at once', () => {
    const problems = problemsOf(() =>
      parseConfigDocument(
        {
          defaultHandler: 'nope',
          handlers: {
            'kata-ts': { vm: { minMemoryMiB: 4096, maxMemoryMiB: 1024, defaultMemoryMiB: 512 } },
            'kata-ts-cvm': { vm: { hotplugVcpus: 2, freePageReporting: true }, pcie: { vfioPolicy: 'hot-plug' } },
          },
        },
        'test',
      ),
    );
    expect(problems).toHaveLength(5);
    expect(problems.join('\n')).toMatch(/\/handlers\/kata-ts-cvm\/vm\/freePageReporting must be false/);
    expect(problems.join('\n')).toMatch(/defaultHandler "nope"/);
    expect(problems.join('\n')).toMatch(/\/handlers\/kata-ts\/vm\/minMemoryMiB 4096 exceeds maxMemoryMiB 1024/);
    expect(problems.join('\n')).toMatch(/\/handlers\/kata-ts-cvm\/vm\/hotplugVcpus/);
    expect(problems.join('\n')).toMatch(/\/handlers\/kata-ts-cvm\/pcie\/vfioPolicy/);
  });
});

describe('VMM confinement settings', () => {
  it('every handler confines its QEMU by default: seccomp and an identity of its own from the node range', () => {
    const config = parseConfigDocument({}, 'test');
    for (const h of Object.values(config.handlers)) {
      expect(h.vmmConfinement).toEqual({ seccomp: true, unprivileged: true, optOutReason: null });
    }
    expect(config.hypervisor.vmmIdentities).toEqual({
      firstId: 2_000_000_000,
      count: 65_536,
      leaseDir: '/var/lib/kata-ts/vmm-identities',
      quarantineMs: 30_000,
    });
  });

  it('turning either off needs a reason; with one the handler is accepted as written', () => {
    const problems = problemsOf(() =>
      parseConfigDocument(
        {
          handlers: {
            a: { vmmConfinement: { seccomp: false } },
            b: { vmmConfinement: { unprivileged: false, optOutReason: '   ' } },
          },
        },
        'test',
      ),
    );
    expect(problems).toEqual([
      '/handlers/a/vmmConfinement/optOutReason must say why seccomp is turned off',
      '/handlers/b/vmmConfinement/optOutReason must say why unprivileged is turned off',
    ]);
    const ok = parseConfigDocument(
      { handlers: { dbg: { vmmConfinement: { seccomp: false, optOutReason: 'gdb attaches to QEMU' } } } },
      'test',
    );
    expect(ok.handlers.dbg!.vmmConfinement).toEqual({ seccomp: false, unprivileged: true, optOutReason: 'gdb attaches to QEMU' });
  });

  it('the identity range stays inside uid_t and never starts at root', () => {
    expect(problemsOf(() => parseConfigDocument({ hypervisor: { vmmIdentities: { firstId: 0 } } }, 'test')).join()).toMatch(
      /vmmIdentities\/firstId/,
    );
    expect(
      problemsOf(() => parseConfigDocument({ hypervisor: { vmmIdentities: { firstId: 4_294_967_290, count: 100 } } }, 'test')),
    ).toEqual(['/hypervisor/vmmIdentities firstId 4294967290 + count 100 runs past the last uid (4294967294)']);
  });
});

describe('loadConfig', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-config-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads a file and reports its path', async () => {
    const file = path.join(dir, 'config.json');
    await writeFile(file, JSON.stringify({ logLevel: 'debug' }));
    const loaded = await loadConfig(file);
    expect(loaded.path).toBe(file);
    expect(loaded.config.logLevel).toBe('debug');
  });

  it('a named file that does not exist is NOT_FOUND; bad JSON is INVALID', async () => {
    await expect(loadConfig(path.join(dir, 'missing.json'))).rejects.toMatchObject({ kind: 'not_found', reason: 'CONFIG_NOT_FOUND' });
    const bad = path.join(dir, 'bad.json');
    await writeFile(bad, '{ "logLevel": ');
    await expect(loadConfig(bad)).rejects.toMatchObject({ kind: 'invalid', reason: 'CONFIG_INVALID' });
  });
});

describe('handler lookup', () => {
  const config = defaultConfig();
  it('"" selects the default handler', () => {
    expect(resolveHandler(config, '').name).toBe('kata-ts');
    expect(resolveHandler(config, 'kata-ts-cvm').profile.confidential).toBe(true);
  });
  it('an unknown handler is NOT_FOUND and names the known ones', () => {
    let caught: unknown;
    try {
      resolveHandler(config, 'runc');
    } catch (err) {
      caught = err;
    }
    expect(caught).toMatchObject({ kind: 'not_found', reason: 'HANDLER_UNKNOWN' });
    expect((caught as Error).message).toContain('kata-ts, kata-ts-cvm');
  });
});

describe('shipped example config', () => {
  it('deploy/config.example.json is valid', async () => {
    const file = path.join(__dirname, '../../../deploy/config.example.json');
    const loaded = await loadConfig(file);
    expect(loaded.config.handlers['kata-ts']!.vm.maxVcpus).toBe(16);
  });
});
