import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildQemuArgv, type QemuArgvSpec } from '../../../src/hypervisor/argv.js';
import { detectHostTee, parseQemuVersion, resolveTeeKind, teeLaunchProblem } from '../../../src/hypervisor/tee.js';
import { thrown } from '../../helpers/kata-error.js';

/** A static confidential VM (the kata-ts-cvm handler's shape) without a TEE yet. */
function cvm(accel: 'kvm' | 'tcg' = 'tcg'): QemuArgvSpec {
  return {
    name: 'cvm-1',
    shape: { vcpus: 1, maxVcpus: 1, memoryMiB: 1024, maxMemoryMiB: 1024, hugepages: [], kernelParams: [] },
    accel,
    kernelPath: '/g/vmlinuz',
    initrdPath: '/g/initramfs.cpio.gz',
    kernelParams: [],
    paths: {
      qmpSocket: '/w/vmm/qmp.sock',
      readySocket: '/w/vmm/ready.sock',
      consoleLog: '/w/vmm/console.log',
      virtiofsSocket: '/w/vmm/vfs.sock',
    },
    pcieArgs: [],
    confidential: true,
  };
}
const flagValues = (argv: string[], flag: string): string[] =>
  argv.flatMap((a, i) => (a === flag && argv[i + 1] !== undefined ? [argv[i + 1]!] : []));

describe('buildQemuArgv: vtpm', () => {
  const spec: QemuArgvSpec = {
    ...cvm(),
    tee: {
      kind: 'vtpm',
      ovmfCodePath: '/usr/share/OVMF/OVMF_CODE_4M.fd',
      ovmfVarsPath: '/w/vmm/OVMF_VARS.fd',
      tpmSocket: '/w/tpm-sock/ctrl.sock',
      initdataPath: '/w/initdata.toml',
    },
  };
  const argv = buildQemuArgv(spec);

  it('maps OVMF code read-only as unit 0 and the pod copy of the vars writable as unit 1', () => {
    expect(flagValues(argv, '-drive').filter((d) => d.startsWith('if=pflash'))).toEqual([
      'if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd',
      'if=pflash,format=raw,unit=1,file=/w/vmm/OVMF_VARS.fd',
    ]);
    expect(argv).not.toContain('-bios');
  });

  it("connects a CRB TPM to swtpm's control socket and hands the initdata over fw_cfg", () => {
    expect(flagValues(argv, '-chardev')).toContain('socket,id=chrtpm,path=/w/tpm-sock/ctrl.sock');
    expect(flagValues(argv, '-tpmdev')).toEqual(['emulator,id=tpm0,chardev=chrtpm']);
    expect(flagValues(argv, '-device')).toContain('tpm-crb,id=tpmcrb0,tpmdev=tpm0');
    expect(flagValues(argv, '-fw_cfg')).toEqual(['name=opt/org.kata-ts/initdata,file=/w/initdata.toml']);
  });

  it('keeps an ordinary q35 with RAM as NUMA node 0 (it runs under TCG)', () => {
    expect(flagValues(argv, '-machine')).toEqual(['q35']);
    expect(flagValues(argv, '-numa')).toEqual(['node,memdev=ram0']);
  });

  it('has no fw_cfg file without initdata, and no TEE arguments at all for kind none', () => {
    const { initdataPath: _i, ...tee } = spec.tee as Extract<QemuArgvSpec['tee'], { kind: 'vtpm' }>;
    expect(buildQemuArgv({ ...spec, tee })).not.toContain('-fw_cfg');
    const none = buildQemuArgv({ ...cvm(), tee: { kind: 'none' } });
    expect(none).toEqual(buildQemuArgv(cvm()));
    for (const flag of ['-tpmdev', '-fw_cfg', '-bios']) expect(none).not.toContain(flag);
    expect(none.join(' ')).not.toContain('pflash');
  });

  it('refuses a TEE on a VM that is not confidential, naming the field', () => {
    const err = thrown(() => buildQemuArgv({ ...spec, confidential: false }));
    expect(err.reason).toBe('TEE_NEEDS_CONFIDENTIAL');
    expect(err.message).toContain('tee.kind');
  });

  it('refuses a relative vars path and an over-long TPM socket path', () => {
    const tee = spec.tee as Extract<QemuArgvSpec['tee'], { kind: 'vtpm' }>;
    const rel = thrown(() => buildQemuArgv({ ...spec, tee: { ...tee, ovmfVarsPath: 'vars.fd' } }));
    expect(rel.reason).toBe('VM_PATH_INVALID');
    expect(rel.message).toContain('tee.ovmfVarsPath');
    const long = thrown(() => buildQemuArgv({ ...spec, tee: { ...tee, tpmSocket: `/${'x'.repeat(120)}` } }));
    expect(long.reason).toBe('UNIX_SOCKET_PATH_TOO_LONG');
  });
});

describe('buildQemuArgv: snp and tdx (argv only: no such hardware here)', () => {
  it('snp: the sev-snp-guest object with kernel hashes and HOST_DATA, its firmware as -bios, RAM on the machine', () => {
    const hostData = Buffer.alloc(32, 0xab);
    const argv = buildQemuArgv({
      ...cvm('kvm'),
      tee: { kind: 'snp', firmwarePath: '/usr/share/ovmf/OVMF.amdsev.fd', hostData, initdataPath: '/w/initdata.toml' },
    });
    expect(flagValues(argv, '-machine')).toEqual(['q35,confidential-guest-support=sev0,memory-backend=ram0']);
    expect(flagValues(argv, '-object')).toEqual([
      'memory-backend-memfd,id=ram0,size=1024M,share=on',
      `sev-snp-guest,id=sev0,cbitpos=51,reduced-phys-bits=1,kernel-hashes=on,host-data=${hostData.toString('base64')}`,
    ]);
    expect(flagValues(argv, '-bios')).toEqual(['/usr/share/ovmf/OVMF.amdsev.fd']);
    expect(argv).not.toContain('-numa');
    expect(argv.join(' ')).not.toContain('pflash');
    expect(argv).not.toContain('-tpmdev');
    expect(flagValues(argv, '-fw_cfg')).toEqual(['name=opt/org.kata-ts/initdata,file=/w/initdata.toml']);
  });

  it('tdx: the tdx-guest object with MRCONFIGID, split irqchip, its firmware as -bios', () => {
    const mrConfigId = Buffer.alloc(48, 0x01);
    const argv = buildQemuArgv({ ...cvm('kvm'), tee: { kind: 'tdx', firmwarePath: '/usr/share/ovmf/OVMF.inteltdx.fd', mrConfigId } });
    expect(flagValues(argv, '-machine')).toEqual(['q35,kernel-irqchip=split,confidential-guest-support=tdx0,memory-backend=ram0']);
    expect(flagValues(argv, '-object')).toContain(`tdx-guest,id=tdx0,mrconfigid=${mrConfigId.toString('base64')}`);
    expect(flagValues(argv, '-bios')).toEqual(['/usr/share/ovmf/OVMF.inteltdx.fd']);
  });

  it('no free page reporting, no virtio-mem on a hardware TEE guest (the confidential rules hold)', () => {
    const argv = buildQemuArgv({ ...cvm('kvm'), tee: { kind: 'snp', firmwarePath: '/f.fd' } });
    expect(argv.join(' ')).not.toMatch(/virtio-balloon|virtio-mem/);
    const err = thrown(() => buildQemuArgv({ ...cvm('kvm'), freePageReporting: true, tee: { kind: 'snp', firmwarePath: '/f.fd' } }));
    expect(err.reason).toBe('CONFIDENTIAL_VM_NO_BALLOON');
  });

  it('refuses SNP or TDX under TCG and binding values of the wrong size', () => {
    expect(thrown(() => buildQemuArgv({ ...cvm('tcg'), tee: { kind: 'snp', firmwarePath: '/f.fd' } })).reason).toBe('TEE_NEEDS_KVM');
    const snp = thrown(() => buildQemuArgv({ ...cvm('kvm'), tee: { kind: 'snp', firmwarePath: '/f.fd', hostData: Buffer.alloc(31) } }));
    expect(snp.reason).toBe('TEE_BINDING_INVALID');
    expect(snp.message).toContain('tee.hostData');
    const tdx = thrown(() => buildQemuArgv({ ...cvm('kvm'), tee: { kind: 'tdx', firmwarePath: '/f.fd', mrConfigId: Buffer.alloc(32) } }));
    expect(tdx.message).toContain('tee.mrConfigId');
  });
});

describe('host TEE detection and resolution', () => {
  const root = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-tee-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const tree = (name: string, files: Record<string, string>) => {
    const base = path.join(root, name);
    mkdirSync(path.join(base, 'dev'), { recursive: true });
    mkdirSync(path.join(base, 'sys'), { recursive: true });
    for (const [p, content] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(base, p)), { recursive: true });
      writeFileSync(path.join(base, p), content);
    }
    return { dev: path.join(base, 'dev'), sysModule: path.join(base, 'sys') };
  };

  it('finds SNP only with /dev/sev and kvm_amd sev_snp=Y, TDX with kvm_intel tdx=Y', () => {
    const none = detectHostTee(tree('none', {}));
    expect(none.snp.ok).toBe(false);
    expect(none.tdx.ok).toBe(false);
    expect(detectHostTee(tree('sev-only', { 'dev/sev': '' })).snp.ok).toBe(false);
    expect(detectHostTee(tree('sev-off', { 'dev/sev': '', 'sys/kvm_amd/parameters/sev_snp': 'N\n' })).snp.ok).toBe(false);
    expect(detectHostTee(tree('snp', { 'dev/sev': '', 'sys/kvm_amd/parameters/sev_snp': 'Y\n' })).snp.ok).toBe(true);
    expect(detectHostTee(tree('tdx', { 'sys/kvm_intel/parameters/tdx': 'Y\n' })).tdx.ok).toBe(true);
  });

  it('auto is snp, then tdx, else vtpm with the reason; an explicit kind stays', () => {
    const no = { ok: false, message: 'no' };
    const yes = { ok: true, message: 'yes' };
    expect(resolveTeeKind('auto', { snp: no, tdx: no })).toEqual({ kind: 'vtpm', reason: 'no SNP or TDX on this host' });
    expect(resolveTeeKind('auto', { snp: yes, tdx: yes }).kind).toBe('snp');
    expect(resolveTeeKind('auto', { snp: no, tdx: yes }).kind).toBe('tdx');
    expect(resolveTeeKind('none', { snp: yes, tdx: yes }).kind).toBe('none');
  });

  it("Debian 12's QEMU 7.2 cannot start SNP or TDX; new enough QEMU on the hardware with KVM can", () => {
    const v72 = parseQemuVersion('QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)');
    expect(v72).toEqual({ major: 7, minor: 2, micro: 22 });
    const yes = { ok: true, message: 'yes' };
    const host = { snp: yes, tdx: yes };
    expect(teeLaunchProblem('snp', { host, qemuVersion: v72, accel: 'kvm' })).toMatch(/QEMU 7\.2\.22 cannot start SEV-SNP.*9\.1\.0/);
    expect(teeLaunchProblem('tdx', { host, qemuVersion: { major: 10, minor: 0, micro: 2 }, accel: 'kvm' })).toMatch(/10\.1\.0/);
    expect(teeLaunchProblem('snp', { host, qemuVersion: { major: 9, minor: 1, micro: 0 }, accel: 'kvm' })).toBeNull();
    expect(teeLaunchProblem('tdx', { host, qemuVersion: { major: 10, minor: 1, micro: 0 }, accel: 'tcg' })).toMatch(/KVM/);
    expect(teeLaunchProblem('snp', { host, qemuVersion: null, accel: 'kvm' })).toMatch(/unknown/);
    expect(teeLaunchProblem('vtpm', { host, qemuVersion: v72, accel: 'tcg' })).toBeNull();
  });
});
