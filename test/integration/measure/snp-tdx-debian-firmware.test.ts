/**
 * Debian's own SNP and TDX firmware, fetched by package name from Debian's archive (sid: the
 * only suite that ships ovmf-amdsev and ovmf-inteltdx today) into the tests' cache, measured
 * with src/measure.
 *
 * No SNP/TDX hardware exists here, and nobody publishes launch digests for Debian's builds, so
 * this test checks what can be checked on the real files: where the packages put them, that
 * their OVMF metadata parses and says what QEMU needs (SNP ranges, the kernel hashes table, the
 * AP reset vector; TDVF sections), and which bytes each measurement covers. The arithmetic is
 * checked against published vectors in the unit tests (test/unit/measure/snp.test.ts:
 * virtee/sev-snp-measure; test/unit/measure/tdx.test.ts: aleph-im/aleph-vm, incl. hardware
 * vectors). The values computed here are printed for the record, not compared with anything.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { FOUR_GIB, parseSevMetadata, parseTdvfMetadata, TDVF_ATTRIBUTE_EXTEND_MR } from '../../../src/measure/ovmf-metadata.js';
import { snpMeasurement } from '../../../src/measure/snp.js';
import { tdxMeasurements, tdxMrtd } from '../../../src/measure/tdx.js';
import { type FetchedDebianPackage, fetchDebianPackage, hostDebianMirror } from '../../helpers/debian-packages.js';

/** Where Debian's packages install the images (the paths the tee-launch config points at). */
const SNP_FIRMWARE = 'usr/share/ovmf/OVMF.amdsev.fd';
const TDX_FIRMWARE = 'usr/share/ovmf/OVMF.inteltdx.ms.fd';

let amdsev: FetchedDebianPackage;
let inteltdx: FetchedDebianPackage;

beforeAll(async () => {
  amdsev = await fetchDebianPackage({ suite: 'sid', package: 'ovmf-amdsev' });
  inteltdx = await fetchDebianPackage({ suite: 'sid', package: 'ovmf-inteltdx' });
});

describe('the Debian package helper', () => {
  it('fetched both packages from the host mirror, extracted, and a second fetch reuses the cache', async () => {
    expect(amdsev.mirror).toBe(hostDebianMirror());
    expect(amdsev.arch).toBe('all');
    expect(existsSync(join(amdsev.root, SNP_FIRMWARE))).toBe(true);
    expect(existsSync(join(inteltdx.root, TDX_FIRMWARE))).toBe(true);
    const debMtime = statSync(amdsev.debPath).mtimeMs;
    const again = await fetchDebianPackage({ suite: 'sid', package: 'ovmf-amdsev', version: amdsev.version });
    expect(again).toEqual(amdsev);
    expect(statSync(again.debPath).mtimeMs).toBe(debMtime);
  });

  it('refuses a name that is not a package name before running apt', async () => {
    await expect(fetchDebianPackage({ suite: 'sid', package: '-o=evil' })).rejects.toThrow(/package/);
    await expect(fetchDebianPackage({ suite: 'sid/../x', package: 'ovmf' })).rejects.toThrow(/suite/);
  });
});

describe("Debian's OVMF.amdsev.fd (SNP)", () => {
  it('has the SNP metadata QEMU measures, a kernel hashes table inside its range and an AP reset vector', () => {
    const firmware = readFileSync(join(amdsev.root, SNP_FIRMWARE));
    expect(firmware.length % 4096).toBe(0);
    const sev = parseSevMetadata(firmware);
    const kinds = new Set(sev.sections.map((s) => s.kind));
    for (const kind of ['SNP_SEC_MEM', 'SNP_SECRETS', 'CPUID', 'SNP_KERNEL_HASHES'] as const) expect(kinds).toContain(kind);
    const hashes = sev.sections.find((s) => s.kind === 'SNP_KERNEL_HASHES');
    expect(sev.hashesTableGpa).toBeGreaterThanOrEqual(hashes?.gpa ?? Number.POSITIVE_INFINITY);
    expect((sev.hashesTableGpa ?? 0) + 176).toBeLessThanOrEqual((hashes?.gpa ?? 0) + (hashes?.sizeBytes ?? 0));
    expect(sev.apResetEip).toBeGreaterThan(0);
    // Every range lies in low memory, below the firmware mapped under 4 GiB.
    for (const s of sev.sections) expect(s.gpa + s.sizeBytes).toBeLessThanOrEqual(FOUR_GIB - firmware.length);

    const input = {
      firmware,
      vcpus: 2,
      vcpuType: 'EPYC-v4',
      guestFeatures: 1,
      kernel: Buffer.from('k'),
      initrd: Buffer.from('i'),
      cmdline: 'console=hvc0',
    };
    const m = snpMeasurement(input);
    expect(m.launchDigest).toMatch(/^[0-9a-f]{96}$/);
    // Each input the digest covers moves it: a byte of the firmware's code, the command line, a vCPU.
    const codeByte = Buffer.from(firmware);
    codeByte[firmware.length / 2] = (codeByte[firmware.length / 2] ?? 0) ^ 1;
    const others = [
      snpMeasurement({ ...input, firmware: codeByte }).launchDigest,
      snpMeasurement({ ...input, cmdline: 'console=hvc1' }).launchDigest,
      snpMeasurement({ ...input, vcpus: 3 }).launchDigest,
    ];
    expect(new Set([m.launchDigest, ...others]).size).toBe(4);
    console.log(
      `ovmf-amdsev ${amdsev.version}: SNP launch digest (2 x EPYC-v4, features 0x1, kernel "k", initrd "i", "console=hvc0") = ${m.launchDigest}`,
    );
  });
});

describe("Debian's OVMF.inteltdx.ms.fd (TDX)", () => {
  it('has a TDVF descriptor with a measured BFV ending at 4 GiB, an unmeasured CFV, TD_HOB and TempMem', () => {
    const firmware = readFileSync(join(inteltdx.root, TDX_FIRMWARE));
    const sections = parseTdvfMetadata(firmware);
    const bfv = sections.find((s) => s.kind === 'BFV');
    const cfv = sections.find((s) => s.kind === 'CFV');
    expect(bfv?.attributes).toBe(TDVF_ATTRIBUTE_EXTEND_MR);
    expect((bfv?.memoryAddress ?? 0) + (bfv?.memoryBytes ?? 0)).toBe(FOUR_GIB);
    expect((bfv?.dataOffset ?? 0) + (bfv?.rawDataBytes ?? 0)).toBe(firmware.length);
    expect(cfv?.attributes).toBe(0);
    expect(sections.some((s) => s.kind === 'TD_HOB')).toBe(true);
    expect(sections.some((s) => s.kind === 'TEMP_MEM')).toBe(true);

    const mrtd = tdxMrtd(firmware, sections);
    // A byte of the BFV (code) moves MRTD; a byte of the CFV (the variable store with its
    // Secure Boot keys) does not: the firmware measures that into RTMR[0], not predicted here.
    const flip = (offset: number) => {
      const copy = Buffer.from(firmware);
      copy[offset] = (copy[offset] ?? 0) ^ 1;
      return tdxMrtd(copy, sections);
    };
    expect(flip((bfv?.dataOffset ?? 0) + 4096)).not.toBe(mrtd);
    expect(flip((cfv?.dataOffset ?? 0) + 4096)).toBe(mrtd);
    console.log(`ovmf-inteltdx ${inteltdx.version}: MRTD = ${mrtd}`);
  });

  it("predicts RTMR[1]/[2] for the installed guest kernel (a real bzImage's PE header) and reports MRCONFIGID beside", () => {
    const kernelPath = '/usr/local/share/kata-ts/guest/vmlinuz';
    expect(existsSync(kernelPath), `${kernelPath} (installed by scripts/setup.sh)`).toBe(true);
    const firmware = readFileSync(join(inteltdx.root, TDX_FIRMWARE));
    const m = tdxMeasurements({
      firmware,
      kernel: readFileSync(kernelPath),
      initrd: Buffer.from('initrd'),
      cmdline: 'console=hvc0',
      mrConfigId: Buffer.alloc(48, 1),
    });
    expect(m.rtmr[1]).toMatch(/^[0-9a-f]{96}$/);
    expect(m.rtmr[2]).toMatch(/^[0-9a-f]{96}$/);
    expect(m.events.map((e) => e.rtmr)).toEqual([1, 1, 1, 1, 1, 2, 2]);
    expect(m.mrConfigId).toBe('01'.repeat(48));
  });
});
