import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { chooseAcceleration } from '../../../src/hypervisor/accel.js';

describe('chooseAcceleration', () => {
  let root: string;
  let roots: { devKvm: string; sysModule: string };

  beforeEach(() => {
    root = mkdtempSync(path.join(os.tmpdir(), 'accel-'));
    roots = { devKvm: path.join(root, 'dev/kvm'), sysModule: path.join(root, 'sys/module') };
    mkdirSync(path.join(root, 'dev'));
    mkdirSync(roots.sysModule, { recursive: true });
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const kvmDevice = (): void => writeFileSync(roots.devKvm, '');

  it('takes an explicit setting whatever the host offers', () => {
    expect(chooseAcceleration('kvm', roots)).toMatchObject({ accel: 'kvm' });
    kvmDevice();
    mkdirSync(path.join(roots.sysModule, 'kvm_pvm'));
    expect(chooseAcceleration('tcg', roots)).toMatchObject({ accel: 'tcg' });
    expect(chooseAcceleration('kvm', roots).reason).toContain('config');
  });

  it('auto: TCG when /dev/kvm is missing', () => {
    const choice = chooseAcceleration('auto', roots);
    expect(choice.accel).toBe('tcg');
    expect(choice.reason).toContain('does not exist');
  });

  it('auto: KVM on an ordinary KVM host', () => {
    kvmDevice();
    mkdirSync(path.join(roots.sysModule, 'kvm_intel'));
    expect(chooseAcceleration('auto', roots)).toMatchObject({ accel: 'kvm' });
  });

  it('auto: TCG on a PVM host', () => {
    kvmDevice();
    mkdirSync(path.join(roots.sysModule, 'kvm_pvm'));
    const choice = chooseAcceleration('auto', roots);
    expect(choice.accel).toBe('tcg');
    expect(choice.reason).toContain('kvm_pvm');
  });

  it('auto: TCG when /dev/kvm cannot be opened read-write', () => {
    // Tests run as root, which ignores file modes; a directory cannot be opened O_RDWR by anyone.
    mkdirSync(roots.devKvm);
    const choice = chooseAcceleration('auto', roots);
    expect(choice.accel).toBe('tcg');
    expect(choice.reason).toContain('EISDIR');
  });
});
