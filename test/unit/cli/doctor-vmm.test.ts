/**
 * `kata-ts doctor`'s VMM checks against this host's real QEMU and setpriv, and the systemd unit
 * `kata-ts serve` ships with: its hardening, and none of the options that would break the daemon.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { vmmChecks } from '../../../src/cli/doctor.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { probeQemuSandbox } from '../../../src/hypervisor/confine-probe.js';

describe('doctor: VMM confinement', () => {
  it('this host: QEMU runs under the full -sandbox option, setpriv is in /usr/bin, every handler confines', async () => {
    const checks = await vmmChecks(defaultConfig());
    // By name: checks are added beside these (the jailer's, the identity range's).
    const check = (name: string) => checks.find((c) => c.name === name);
    for (const name of ['vmm-seccomp', 'vmm-identity', 'vmm-identity-range', 'vmm-handlers']) expect(check(name)?.verdict, name).toBe('ok');
    expect(check('vmm-identity')!.message).toMatch(/^setpriv from util-linux .* drops QEMU's privileges$/);
    expect(check('vmm-identity-range')!.message).toMatch(/^uids\/gids 2000000000-2000065535: /);
    expect(check('vmm-handlers')!.message).toBe(
      'kata-ts: seccomp, own uid, no capabilities, jail; kata-ts-cvm: seccomp, own uid, no capabilities, jail',
    );
  });

  it('a QEMU that refuses the option fails the check where a handler wants seccomp, and only warns where none does', async () => {
    const refused = await probeQemuSandbox('qemu-system-x86_64', 'on,nosuchgroup=deny');
    expect(refused).toEqual({ ok: false, message: expect.stringContaining("Invalid parameter 'nosuchgroup'") });
    const config = defaultConfig();
    config.hypervisor.qemuBinary = '/nonexistent/qemu-system-x86_64';
    expect((await vmmChecks(config))[0]).toMatchObject({ name: 'vmm-seccomp', verdict: 'fail' });
    for (const h of Object.values(config.handlers)) h.vmmConfinement = { seccomp: false, unprivileged: true, optOutReason: 'test' };
    const after = await vmmChecks(config);
    expect(after.find((c) => c.name === 'vmm-seccomp')).toMatchObject({ verdict: 'warn' });
    expect(after.find((c) => c.name === 'vmm-handlers')).toMatchObject({
      verdict: 'warn',
      message: 'kata-ts: seccomp off (test); kata-ts-cvm: seccomp off (test)',
    });
  });
});

describe('deploy/kata-ts.service', () => {
  const text = readFileSync(path.join(packageRoot(), 'deploy', 'kata-ts.service'), 'utf8');
  const settings = new Map(
    text
      .split('\n')
      .filter((l) => /^[A-Za-z]+=/.test(l))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );

  it('hardens what the daemon survives and raises RLIMIT_MEMLOCK for confined VFIO VMMs', () => {
    expect(Object.fromEntries([...settings].filter(([k]) => HARDENING.includes(k)))).toEqual({
      NoNewPrivileges: 'yes',
      LockPersonality: 'yes',
      RestrictRealtime: 'yes',
      SystemCallArchitectures: 'native',
      KeyringMode: 'private',
      RestrictAddressFamilies: 'AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET',
      LimitMEMLOCK: 'infinity',
    });
    expect(settings.get('KillMode')).toBe('process');
  });

  it('sets none of the options that would break it (each named with why in the unit)', () => {
    for (const option of BREAKING) {
      expect([option, settings.has(option)]).toEqual([option, false]);
      expect(text).toContain(option);
    }
  });

  it.skipIf(!existsSync('/usr/bin/systemd-analyze'))('systemd-analyze verify accepts it', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-unit-'));
    try {
      const unit = path.join(dir, 'kata-ts.service');
      writeFileSync(unit, text.replaceAll('@ROOT@', '/opt/kata-ts'));
      expect(execFileSync('systemd-analyze', ['verify', unit], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })).toBe('');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

const HARDENING = [
  'NoNewPrivileges',
  'LockPersonality',
  'RestrictRealtime',
  'SystemCallArchitectures',
  'KeyringMode',
  'RestrictAddressFamilies',
  'LimitMEMLOCK',
];
/** Mount namespace of its own, device policy, set-uid files, W^X, namespaces: see the unit's comment. */
const BREAKING = [
  'ProtectSystem',
  'ProtectHome',
  'PrivateTmp',
  'DeviceAllow',
  'ProtectClock',
  'RestrictSUIDSGID',
  'MemoryDenyWriteExecute',
  'RestrictNamespaces',
];
