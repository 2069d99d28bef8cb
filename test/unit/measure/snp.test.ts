/**
 * SNP launch digests against published vectors.
 *
 * Every expected digest below is copied from virtee/sev-snp-measure's tests/test_guest.py
 * (commit 8f2b337e38bc83f87cd30f3253cdfe8e3e12cc3a, Apache-2.0), computed there with the same
 * inputs: the 4 KiB firmware suffixes test/fixtures/measure/ovmf_AmdSev_suffix.bin and
 * ovmf_OvmfX64_suffix.bin (copied from that repository's tests/fixtures, Apache-2.0; see
 * test/fixtures/measure/README.md), vCPU type EPYC-v4, VMM type QEMU, "/dev/null" as kernel and
 * initrd where the upstream test passes it (an empty file here).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseSevMetadata } from '../../../src/measure/ovmf-metadata.js';
import {
  cpuSignature,
  cpuSignatureFromCpuinfo,
  SNP_VCPU_SIGNATURES,
  sevHashesTable,
  snpLaunchDigest,
  snpMeasurement,
  snpReferenceValues,
} from '../../../src/measure/snp.js';
import { thrown } from '../../helpers/kata-error.js';

function expectKataError(fn: () => unknown, reason: string, message?: RegExp): void {
  const err = thrown(fn);
  expect(err.reason).toBe(reason);
  if (message !== undefined) expect(err.message).toMatch(message);
}

const fixtures = join(import.meta.dirname, '../../fixtures/measure');
const amdSev = readFileSync(join(fixtures, 'ovmf_AmdSev_suffix.bin'));
const ovmfX64 = readFileSync(join(fixtures, 'ovmf_OvmfX64_suffix.bin'));
const empty = Buffer.alloc(0);

describe('SNP launch digest: published vectors (virtee/sev-snp-measure tests/test_guest.py)', () => {
  const cases: { name: string; vcpus: number; features: number; kernel: boolean; cmdline?: string; expected: string }[] = [
    {
      name: 'test_snp_default',
      vcpus: 1,
      features: 0x21,
      kernel: true,
      cmdline: 'console=ttyS0 loglevel=7',
      expected: '803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb28c653360fe4b3aba7e534442e7e1e17895dfe778d0228977',
    },
    {
      name: 'test_snp_guest_feature_snp_only',
      vcpus: 1,
      features: 0x1,
      kernel: true,
      cmdline: 'console=ttyS0 loglevel=7',
      expected: '6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa',
    },
    {
      name: 'test_snp_without_kernel_default',
      vcpus: 1,
      features: 0x21,
      kernel: false,
      expected: 'e1e1ca029dd7973ab9513295be68198472dcd4fc834bd9af9b63f6e8a1674dbf281a9278a4a2ebe0eed9f22adbcd0e2b',
    },
    {
      name: 'test_snp_without_kernel_feature_snp_only',
      vcpus: 1,
      features: 0x1,
      kernel: false,
      expected: '19358ba9a7615534a9a1e2f0dfc29384dcd4dcb7062ff9c6013b26869a5fc6ecabe033c48dd6f6db5d6d76e7c5df632d',
    },
    {
      name: 'test_snp_with_multiple_vcpus_default',
      vcpus: 4,
      features: 0x21,
      kernel: true,
      cmdline: '',
      expected: '4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942',
    },
    {
      name: 'test_snp_with_multiple_vcpus_feature_snp_only',
      vcpus: 4,
      features: 0x1,
      kernel: true,
      cmdline: '',
      expected: '5061fffb019493a903613d56d54b94912a1a2f9e4502385f5c194616753720a92441310ba6c4933de877c36e23046ad5',
    },
  ];
  for (const c of cases) {
    it(`${c.name}: ${c.vcpus} vCPU(s), SEV_FEATURES ${c.features}, ${c.kernel ? 'kernel hashes' : 'no kernel'}`, () => {
      const digest = snpLaunchDigest({
        firmware: amdSev,
        vcpus: c.vcpus,
        vcpuType: 'EPYC-v4',
        guestFeatures: c.features,
        ...(c.kernel ? { kernel: empty, initrd: empty, cmdline: c.cmdline ?? '' } : {}),
      });
      expect(digest).toBe(c.expected);
    });
  }

  it('test_snp_with_ovmfx64_without_default / _without_kernel_feature_snp_only: a plain OvmfX64 build', () => {
    const base = { firmware: ovmfX64, vcpus: 1, vcpuType: 'EPYC-v4' };
    expect(snpLaunchDigest({ ...base, guestFeatures: 0x21 })).toBe(
      '28797ae0afaba4005a81e629acebfb59e6687949d6be44007cd5506823b0dd66f146aaae26ff291eed7b493d8a64c385',
    );
    expect(snpLaunchDigest({ ...base, guestFeatures: 0x1 })).toBe(
      'da0296de8193586a5512078dcd719eccecbd87e2b825ad4148c44f665dc87df21e5b49e21523a9ad993afdb6a30b4005',
    );
  });

  it('test_snp_with_ovmfx64_and_kernel_should_fail: a build without SNP_KERNEL_HASHES cannot measure a kernel', () => {
    expectKataError(
      () => snpLaunchDigest({ firmware: ovmfX64, vcpus: 1, vcpuType: 'EPYC-v4', guestFeatures: 0x21, kernel: empty }),
      'MEASURE_FIRMWARE_UNSUPPORTED',
    );
  });

  it('vcpu_types: the EPYC-v4 signature is family 23 model 1 stepping 2 (0x00800f12)', () => {
    expect(cpuSignature(23, 1, 2)).toBe(0x00800f12);
    expect(SNP_VCPU_SIGNATURES['EPYC-Milan']).toBe(0x00a00f11);
    // -cpu host: the host's own family/model/stepping (here an EPYC 7763, Milan).
    expect(
      cpuSignatureFromCpuinfo(
        'processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7763 64-Core Processor\nstepping\t: 1\n',
      ),
    ).toBe(0x00a00f11);
    expect(() => cpuSignatureFromCpuinfo('processor\t: 0\n')).toThrow(/cpu family/);
    // A raw signature gives the same digest as the model's name.
    const named = snpLaunchDigest({ firmware: amdSev, vcpus: 2, vcpuType: 'EPYC-v4', guestFeatures: 1 });
    expect(snpLaunchDigest({ firmware: amdSev, vcpus: 2, vcpuType: 0x00800f12, guestFeatures: 1 })).toBe(named);
  });
});

describe('SNP inputs: what changes the digest and what does not', () => {
  const base = {
    firmware: amdSev,
    vcpus: 2,
    vcpuType: 'EPYC-Milan',
    guestFeatures: 1,
    kernel: Buffer.from('kernel'),
    initrd: Buffer.from('initrd'),
    cmdline: 'console=hvc0',
  };
  const reference = snpLaunchDigest(base);

  it('one byte of the kernel, the initrd or the command line, a vCPU, the CPU model or a feature bit each change it', () => {
    const variants = [
      { ...base, kernel: Buffer.from('kernel!') },
      { ...base, initrd: Buffer.from('initrd!') },
      { ...base, cmdline: 'console=hvc1' },
      { ...base, vcpus: 3 },
      { ...base, vcpuType: 'EPYC-Genoa' },
      { ...base, guestFeatures: 0x21 },
    ].map((v) => snpLaunchDigest(v));
    expect(new Set([reference, ...variants]).size).toBe(variants.length + 1);
  });

  it('HOST_DATA is reported beside the digest, never folded into it', () => {
    const hostData = Buffer.alloc(32, 0xab);
    const m = snpMeasurement({ ...base, hostData });
    expect(m.launchDigest).toBe(reference);
    expect(m.hostData).toBe(hostData.toString('hex'));
    // trustee's default policy reads the digest as snp_launch_measurement; HOST_DATA is not a reference value.
    expect(snpReferenceValues(m)).toEqual({ snp_launch_measurement: reference });
  });

  it("the hashes table is QEMU's: a header GUID, three 50-byte entries, padded to 176 bytes", () => {
    const table = sevHashesTable(Buffer.alloc(0), undefined, undefined);
    expect(table.length).toBe(176);
    expect(table.readUInt16LE(16)).toBe(168);
    // The command-line entry hashes a lone NUL; the kernel entry the empty file.
    expect(table.subarray(18 + 18, 18 + 50).toString('hex')).toBe('6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d');
    expect(table.subarray(118 + 18, 168).toString('hex')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });

  it('the metadata of the AmdSev fixture lists the SNP ranges in order', () => {
    const sev = parseSevMetadata(amdSev);
    expect(sev.sections.map((s) => s.kind)).toEqual([
      'SNP_SEC_MEM',
      'SNP_SEC_MEM',
      'SNP_SECRETS',
      'CPUID',
      'SVSM_CAA',
      'SNP_KERNEL_HASHES',
      'SNP_SEC_MEM',
    ]);
    expect(sev.apResetEip).toBeGreaterThan(0);
    expect(sev.hashesTableGpa).toBeDefined();
  });

  it('bad input is refused naming the field', () => {
    expectKataError(() => snpLaunchDigest({ ...base, vcpus: 0 }), 'MEASURE_TEE_INPUT_INVALID', /vcpus/);
    expectKataError(() => snpLaunchDigest({ ...base, vcpuType: 'Skylake' }), 'MEASURE_TEE_INPUT_INVALID', /vcpuType/);
    expectKataError(() => snpLaunchDigest({ ...base, guestFeatures: 0x20 }), 'MEASURE_TEE_INPUT_INVALID', /guestFeatures/);
    expectKataError(() => snpLaunchDigest({ ...base, hostData: Buffer.alloc(31) }), 'MEASURE_TEE_INPUT_INVALID', /hostData/);
    expectKataError(() => snpLaunchDigest({ ...base, cmdline: 'a\0b' }), 'MEASURE_TEE_INPUT_INVALID', /cmdline/);
    expectKataError(() => snpLaunchDigest({ ...base, firmware: Buffer.alloc(4096) }), 'MEASURE_FIRMWARE_UNSUPPORTED');
    expectKataError(() => snpLaunchDigest({ ...base, firmware: amdSev.subarray(0, 4000) }), 'MEASURE_FIRMWARE_MALFORMED');
  });

  it('a footer table that claims more than the image is refused', () => {
    const broken = Buffer.from(amdSev);
    broken.writeUInt16LE(0xffff, broken.length - 32 - 18);
    expectKataError(() => parseSevMetadata(broken), 'MEASURE_FIRMWARE_MALFORMED');
  });
});
