/**
 * Reading a planned VM's launch inputs back out of its QEMU argv (src/measure/launch.ts): the
 * files, command line and memory the vTPM prediction is computed from.
 */
import { describe, expect, it } from 'vitest';
import { launchInputsFromArgv, qemuMemoryBytes } from '../../../src/measure/launch.js';
import { thrown } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;
const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE_4M.fd';
const VTPM_ARGS = [
  ...['-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${OVMF_CODE}`],
  ...['-drive', 'if=pflash,format=raw,unit=1,file=/var/lib/kata-ts/vm/x/vmm/ovmf,,vars.fd'],
  ...['-chardev', 'socket,id=tpmchr,path=/var/lib/kata-ts/vm/x/tpm/swtpm.sock'],
  ...['-tpmdev', 'emulator,id=tpm0,chardev=tpmchr'],
  ...['-device', 'tpm-crb,id=tpmdev0,tpmdev=tpm0'],
];

describe('launch inputs from a planned argv', () => {
  it('reads -kernel, -initrd, -append, -m, both pflash units (doubled commas undone) and the tpm device', () => {
    const argv = ['-m', 'size=416M,maxmem=4512M', '-kernel', '/k', '-initrd', '/i', '-append', 'console=ttyS0 quiet', ...VTPM_ARGS];
    expect(launchInputsFromArgv(argv)).toEqual({
      kernelPath: '/k',
      initrdPath: '/i',
      cmdline: 'console=ttyS0 quiet',
      memoryBytes: 416 * MiB,
      ovmfCodePath: OVMF_CODE,
      ovmfVarsCopyPath: '/var/lib/kata-ts/vm/x/vmm/ovmf,vars.fd',
      hasTpm: true,
    });
    expect(launchInputsFromArgv(['-m', '512', '-kernel', '/k', '-initrd', '/i']).hasTpm).toBe(false);
  });

  it('reads -m as QEMU does (no suffix: MiB) and refuses what it cannot read', () => {
    expect(qemuMemoryBytes('512')).toBe(512 * MiB);
    expect(qemuMemoryBytes('2G')).toBe(2048 * MiB);
    expect(qemuMemoryBytes('size=1024M,slots=2,maxmem=4G')).toBe(1024 * MiB);
    expect(thrown(() => qemuMemoryBytes('lots')).reason).toBe('MEASURE_ARGV_UNREADABLE');
    expect(thrown(() => launchInputsFromArgv(['-m', '512', '-initrd', '/i'])).message).toMatch(/0 -kernel options/);
    expect(thrown(() => launchInputsFromArgv(['-m', '512', '-kernel', '/k', '-initrd', '/i', '-append', 'a', '-append', 'b'])).reason).toBe(
      'MEASURE_ARGV_UNREADABLE',
    );
  });
});
