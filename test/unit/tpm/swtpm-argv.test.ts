/**
 * The pure parts of a pod's swtpm: option validation (each mistake a coded error naming the
 * field), swtpm's and swtpm_setup's argv, and the jail it runs in as planJail lays it out.
 */
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { planJail } from '../../../src/hypervisor/index.js';
import {
  buildSwtpmArgv,
  buildSwtpmSetupArgv,
  type StartSwtpmOptions,
  SWTPM_MIGRATION_KEY_FILE,
  swtpmJailSpec,
  validateSwtpmOptions,
} from '../../../src/tpm/swtpm.js';
import { thrown } from '../../helpers/kata-error.js';

const base: StartSwtpmOptions = {
  stateDir: '/run/pod/tpm',
  ctrlSocketPath: '/run/pod/tpm-sock/ctrl.sock',
  logFile: '/run/pod/swtpm.log',
  caDir: '/var/lib/kata-ts/tpm-ca',
  identity: { uid: 2000000001, gid: 2000000001 },
  clientIdentity: { uid: 2000000000, gid: 2000000000 },
  jail: { jailDir: '/run/pod/tpm-jail' },
  logger: silentLogger(),
};

describe('validateSwtpmOptions', () => {
  it('accepts a whole, confined request', () => {
    expect(() => validateSwtpmOptions(base)).not.toThrow();
  });

  it.each([
    ['stateDir', { stateDir: 'relative/tpm' }, 'SWTPM_OPTION_INVALID'],
    ['stateDir', { stateDir: '/run/pod/a,b' }, 'SWTPM_OPTION_INVALID'],
    ['ctrlSocketPath', { ctrlSocketPath: `/run/${'x'.repeat(120)}/ctrl.sock` }, 'SWTPM_OPTION_INVALID'],
    ['ctrlSocketPath', { ctrlSocketPath: '/run/pod/tpm/ctrl.sock' }, 'SWTPM_OPTION_INVALID'],
    ['logFile', { logFile: '/run/pod/../swtpm.log' }, 'SWTPM_OPTION_INVALID'],
    ['binary', { binary: '/opt/sw tpm' }, 'SWTPM_OPTION_INVALID'],
    ['identity.uid', { identity: { uid: 0, gid: 5 } }, 'SWTPM_OPTION_INVALID'],
    ['jail', { jail: undefined }, 'SWTPM_JAIL_REQUIRED'],
    ['identity', { identity: undefined }, 'SWTPM_OPTION_INVALID'],
    ['identity', { clientIdentity: { uid: 2000000001, gid: 7 } }, 'SWTPM_IDENTITY_SHARED'],
    ['identity', { clientIdentity: { uid: 7, gid: 2000000001 } }, 'SWTPM_IDENTITY_SHARED'],
  ] as const)('refuses a bad %s with a coded error naming it', (field, patch, reason) => {
    const err = thrown(() => validateSwtpmOptions({ ...base, ...patch } as StartSwtpmOptions));
    expect(err.reason).toBe(reason);
    expect(String(err.details?.field)).toBe(field);
    expect(err.message).toContain(field.split('.')[0]!);
  });

  it('lets an unconfined swtpm (QEMU as root, no identities) through without a jail', () => {
    expect(() =>
      validateSwtpmOptions({ ...base, identity: undefined, clientIdentity: undefined, jail: undefined } as StartSwtpmOptions),
    ).not.toThrow();
  });
});

describe('buildSwtpmArgv', () => {
  it('is the control channel only, with a migration key, stdout logging, a seccomp filter that kills, ending with its data channel', () => {
    expect(buildSwtpmArgv({ stateDir: '/run/pod/tpm', ctrlSocketPath: '/run/pod/tpm-sock/ctrl.sock' })).toEqual([
      'socket',
      '--tpm2',
      '--tpmstate',
      'dir=/run/pod/tpm,mode=0600',
      '--migration-key',
      `file=/run/pod/tpm/${SWTPM_MIGRATION_KEY_FILE},format=hex,mode=aes-256-cbc,remove=true`,
      '--ctrl',
      'type=unixio,path=/run/pod/tpm-sock/ctrl.sock,mode=0600',
      '--log',
      'fd=1,level=1',
      '--seccomp',
      'action=kill',
      '--terminate',
    ]);
  });

  it('has no startup flag: QEMU sends CMD_INIT and the firmware TPM2_Startup', () => {
    const argv = buildSwtpmArgv({ stateDir: '/s', ctrlSocketPath: '/c/s.sock' });
    expect(argv).not.toContain('--flags');
    expect(argv).not.toContain('--server');
  });

  it('refuses a path swtpm would split at its comma', () => {
    expect(thrown(() => buildSwtpmArgv({ stateDir: '/s,mode=0777', ctrlSocketPath: '/c/s.sock' })).reason).toBe('SWTPM_OPTION_INVALID');
  });
});

describe('buildSwtpmSetupArgv', () => {
  it('makes a TPM 2.0 with EKs, their certificates and a platform certificate from the private config, sha256 bank only', () => {
    const argv = buildSwtpmSetupArgv({
      stagingDir: '/run/pod/.swtpm-setup-x',
      setupConfigFile: '/ca/gen-2/swtpm_setup.conf',
      swtpmBinary: '/usr/bin/swtpm',
    });
    expect(argv.slice(0, 5)).toEqual(['--tpm2', '--tpmstate', '/run/pod/.swtpm-setup-x', '--tpm', '/usr/bin/swtpm socket']);
    for (const flag of ['--createek', '--create-ek-cert', '--create-platform-cert', '--not-overwrite']) expect(argv).toContain(flag);
    expect(argv[argv.indexOf('--config') + 1]).toBe('/ca/gen-2/swtpm_setup.conf');
    expect(argv[argv.indexOf('--pcr-banks') + 1]).toBe('sha256');
    expect(argv[argv.indexOf('--write-ek-cert-files') + 1]).toBe('/run/pod/.swtpm-setup-x');
  });
});

describe('swtpmJailSpec', () => {
  it('binds /usr, a /dev without devices beyond the basic four, the state dir and the socket dir: nothing else', () => {
    const spec = swtpmJailSpec({ jailDir: '/run/pod/tpm-jail', stateDir: '/run/pod/tpm', ctrlSocketPath: '/run/pod/tpm-sock/ctrl.sock' });
    const layout = planJail({ ...spec, rootLinks: { lib64: 'usr/lib64' } });
    const targets = layout.fstab
      .trim()
      .split('\n')
      .map((l) => l.split(' ').slice(0, 2));
    expect(targets).toEqual([
      ['/run/pod/tpm-jail', '/run/pod/tpm-jail'],
      ['/usr', '/run/pod/tpm-jail/usr'],
      ['kata-ts-jail-dev', '/run/pod/tpm-jail/dev'],
      ['/run/pod/tpm', '/run/pod/tpm-jail/run/pod/tpm'],
      ['/run/pod/tpm-sock', '/run/pod/tpm-jail/run/pod/tpm-sock'],
    ]);
    expect(layout.deviceCopies).toEqual([{ cwd: '/dev', sources: ['null', 'zero', 'urandom', 'random'] }]);
    expect(layout.ownedDevices).toEqual([]);
  });

  it('binds a swtpm outside /usr read-only at its own path', () => {
    const spec = swtpmJailSpec({ jailDir: '/j', stateDir: '/p/tpm', ctrlSocketPath: '/p/s/c.sock', binary: '/opt/swtpm/bin/swtpm' });
    expect(spec.files).toEqual(['/opt/swtpm/bin/swtpm']);
  });
});
