/**
 * TDX MRTD and RTMR[1]/[2] against published vectors.
 *
 * Where each expected value comes from:
 * - aleph-im/aleph-vm, rust/crates/aleph-tee/src/tdx/measure.rs (commit 6c84eb860b1364b3601c4c37e31a6afb6dce4bf5):
 *   - MRTD 168f5582... of a synthetic three-page TDVF image and the Authenticode SHA-384
 *     27ca0b49... of a synthetic PE32+ image; that file describes both inputs byte by byte and
 *     they are rebuilt here from the description (buildTdvf, buildPe);
 *   - hardware vectors of a TD on QEMU 10.2.4 with edk2-stable202602 TDVF: the load-options
 *     digest b8c85d40... of the command line "root=LABEL=cloudimg-rootfs ro console=ttyS0",
 *     the initrd's SHA-384 88de90... and the resulting RTMR[2] 97254746...;
 *   - the SHA-384 digests of the four constant RTMR[1] events after the kernel.
 * - The separator digest 394341b7... (sha384 of four zero bytes) appears in every published
 *   TDX/TPM SHA-384 event log.
 * No published MRTD of Debian's own OVMF.inteltdx build exists; the integration test
 * test/integration/measure/snp-tdx-debian-firmware.test.ts checks its structure.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { authenticodeDigest } from '../../../src/measure/authenticode.js';
import { guidToBytes, OVMF_TABLE_FOOTER_GUID, parseTdvfMetadata, TDX_METADATA_OFFSET_GUID } from '../../../src/measure/ovmf-metadata.js';
import { replayRtmr, tdxMeasurements, tdxMrtd, tdxReferenceValues } from '../../../src/measure/tdx.js';
import { thrown } from '../../helpers/kata-error.js';

const sha384 = (data: Buffer | string) => createHash('sha384').update(data).digest('hex');

function expectKataError(fn: () => unknown, reason: string, message?: RegExp): void {
  const err = thrown(fn);
  expect(err.reason).toBe(reason);
  if (message !== undefined) expect(err.message).toMatch(message);
}

/** One TDVF section entry: data offset, raw size, GPA, memory size, type, attributes. */
function tdvfSection(dataOffset: number, raw: number, gpa: number, mem: number, type: number, attributes: number): Buffer {
  const s = Buffer.alloc(32);
  s.writeUInt32LE(dataOffset, 0);
  s.writeUInt32LE(raw, 4);
  s.writeBigUInt64LE(BigInt(gpa), 8);
  s.writeBigUInt64LE(BigInt(mem), 16);
  s.writeUInt32LE(type, 24);
  s.writeUInt32LE(attributes, 28);
  return s;
}

function footerEntry(guid: Buffer, data: Buffer): Buffer {
  const header = Buffer.alloc(2);
  header.writeUInt16LE(data.length + 18);
  return Buffer.concat([data, header, guid]);
}

/**
 * The synthetic TDVF of the aleph-vm test: 0x3000 bytes of the pattern (i*13+5)&0xff; at 0x2000 a
 * TDVF descriptor of four sections (a measured BFV at 0xfffff000 from offset 0, a measured CFV at
 * 0xffffe000 from offset 0x1000, a two-page TD_HOB at 0x809000, a PAGE_AUG TEMP_MEM at 0x80b000);
 * at the end a footer table of three entries (an unrelated GUID of 0x11 bytes with "unrelated",
 * the TDX metadata offset, a GUID of 0x22 bytes with four 0xab bytes), then 32 zero bytes.
 */
function buildTdvf(): Buffer {
  const fw = Buffer.alloc(0x3000);
  for (let i = 0; i < fw.length; i++) fw[i] = (i * 13 + 5) & 0xff;
  const head = Buffer.alloc(16);
  head.write('TDVF', 0, 'latin1');
  head.writeUInt32LE(16 + 4 * 32, 4);
  head.writeUInt32LE(1, 8);
  head.writeUInt32LE(4, 12);
  Buffer.concat([
    head,
    tdvfSection(0, 0x1000, 0xffff_f000, 0x1000, 0, 1),
    tdvfSection(0x1000, 0x1000, 0xffff_e000, 0x1000, 1, 1),
    tdvfSection(0, 0, 0x80_9000, 0x2000, 2, 0),
    tdvfSection(0, 0, 0x80_b000, 0x1000, 3, 2),
  ]).copy(fw, 0x2000);
  const fromEnd = Buffer.alloc(4);
  fromEnd.writeUInt32LE(fw.length - 0x2000);
  const entries = Buffer.concat([
    footerEntry(Buffer.alloc(16, 0x11), Buffer.from('unrelated')),
    footerEntry(guidToBytes(TDX_METADATA_OFFSET_GUID), fromEnd),
    footerEntry(Buffer.alloc(16, 0x22), Buffer.alloc(4, 0xab)),
  ]);
  const tail = Buffer.concat([footerEntry(guidToBytes(OVMF_TABLE_FOOTER_GUID), entries), Buffer.alloc(32)]);
  tail.copy(fw, fw.length - tail.length);
  return fw;
}

/**
 * The synthetic PE32+ of the aleph-vm test: 0x440 bytes of (i*7+3)&0xff, zeroed DOS header with
 * "MZ" and e_lfanew 0x40, "PE\0\0", a COFF header (machine 0x8664, two sections, a 240-byte
 * optional header), the optional header zeroed but for magic 0x20b, SizeOfHeaders 0x200,
 * CheckSum 0x12345678, NumberOfRvaAndSizes, the security directory (0x420, certBytes); two
 * section headers, ".text" (0x100 bytes at 0x300) then ".data" (0x100 bytes at 0x200).
 */
function buildPe(numberOfRvaAndSizes: number, certBytes: number): Buffer {
  const pe = Buffer.alloc(0x440);
  for (let i = 0; i < pe.length; i++) pe[i] = (i * 7 + 3) & 0xff;
  pe.fill(0, 0, 64);
  pe.write('MZ', 0, 'latin1');
  pe.writeUInt32LE(0x40, 0x3c);
  pe.write('PE\0\0', 0x40, 'latin1');
  const coff = 0x44;
  pe.fill(0, coff, coff + 20);
  pe.writeUInt16LE(0x8664, coff);
  pe.writeUInt16LE(2, coff + 2);
  pe.writeUInt16LE(240, coff + 16);
  const opt = coff + 20;
  pe.fill(0, opt, opt + 240);
  pe.writeUInt16LE(0x20b, opt);
  pe.writeUInt32LE(0x200, opt + 60);
  pe.writeUInt32LE(0x1234_5678, opt + 64);
  pe.writeUInt32LE(numberOfRvaAndSizes, opt + 108);
  pe.writeUInt32LE(0x420, opt + 112 + 32);
  pe.writeUInt32LE(certBytes, opt + 112 + 36);
  const table = opt + 240;
  pe.fill(0, table, table + 80);
  for (const [i, [name, pointer]] of (
    [
      ['.text', 0x300],
      ['.data', 0x200],
    ] as const
  ).entries()) {
    const at = table + i * 40;
    pe.write(name, at, 'latin1');
    pe.writeUInt32LE(0x100, at + 16);
    pe.writeUInt32LE(pointer, at + 20);
  }
  return pe;
}

const HW_CMDLINE = 'root=LABEL=cloudimg-rootfs ro console=ttyS0';
const HW_LOAD_OPTIONS = 'b8c85d40a1d555a451571e24d7d7c4c331bc15721d6e4b2a5cb5093214c44174822a0916aa4d622d4309644de99cd59c';
const HW_INITRD_SHA384 = '88de90bedcc560064688c74ccd6609a25ed9d48b0a0e13d8b2a558212724d8755b2c8114dcf04b8d51ea4cf7782e3091';
const HW_RTMR2 = '972547466cb6bcb8a23cd479e9258c3affbbc4f0ba2805d732477200d0dff8432447c7a775e70453cdb51f018a306ece';

describe('TDX MRTD: published vector (aleph-vm synthetic TDVF)', () => {
  const fw = buildTdvf();

  it('MRTD of the synthetic TDVF is 168f5582...', () => {
    expect(tdxMrtd(fw)).toBe('168f5582b72265ed01aad1edd402f5d096c12d95385b5f38959b5cc8c128e6efe6e13e854e211a1ee4e4a4eeafa36fa6');
    expect(parseTdvfMetadata(fw).map((s) => s.kind)).toEqual(['BFV', 'CFV', 'TD_HOB', 'TEMP_MEM']);
  });

  it('a measured byte moves MRTD; an unmeasured byte, or moving the PAGE_AUG section, does not; moving TD_HOB does', () => {
    const base = tdxMrtd(fw);
    const flip = (offset: number, mask: number) => {
      const copy = Buffer.from(fw);
      copy[offset] = (copy[offset] ?? 0) ^ mask;
      return tdxMrtd(copy);
    };
    expect(flip(0x123, 1)).not.toBe(base);
    expect(flip(0x2800, 1)).toBe(base);
    expect(flip(0x2000 + 16 + 2 * 32 + 9, 0x10)).not.toBe(base);
    expect(flip(0x2000 + 16 + 3 * 32 + 9, 0x10)).toBe(base);
  });

  it('firmware without TDX metadata, with a broken signature or sections outside it is refused', () => {
    expectKataError(() => tdxMrtd(Buffer.alloc(0x3000)), 'MEASURE_FIRMWARE_UNSUPPORTED', /TDX metadata/);
    const noSig = Buffer.from(fw);
    noSig.write('XXXX', 0x2000, 'latin1');
    expectKataError(() => tdxMrtd(noSig), 'MEASURE_FIRMWARE_MALFORMED', /TDVF signature/);
    const outside = Buffer.from(fw);
    outside.writeUInt32LE(0x10_0000, 0x2000 + 16 + 4);
    expectKataError(() => tdxMrtd(outside), 'MEASURE_FIRMWARE_MALFORMED');
  });
});

describe('TDX RTMR[1] and RTMR[2]: published vectors', () => {
  const fw = buildTdvf();
  const pe = buildPe(16, 0x20);

  it('the Authenticode SHA-384 of the synthetic PE is 27ca0b49...', () => {
    expect(authenticodeDigest(pe, 'sha384').toString('hex')).toBe(
      '27ca0b497c08dcf49e302a2dd4bbe74889b19d0d1af84364c8cad3472d5ba1bfda1e7cfe7fb94848d491cdfd2a163410',
    );
  });

  it('RTMR[1] chains the kernel with the four constant events, whose digests are the published ones', () => {
    const m = tdxMeasurements({ firmware: fw, kernel: pe, initrd: Buffer.from('initrd'), cmdline: 'console=ttyS0' });
    const r1 = m.events.filter((e) => e.rtmr === 1).map((e) => e.digestSha384);
    expect(r1).toEqual([
      authenticodeDigest(pe, 'sha384').toString('hex'),
      '77a0dab2312b4e1e57a84d865a21e5b2ee8d677a21012ada819d0a98988078d3d740f6346bfe0abaa938ca20439a8d71',
      '394341b7182cd227c5c6b07ef8000cdfd86136c4292b8e576573ad7ed9ae41019f5818b4b971c9effc60e1ad9f1289f0',
      '214b0bef1379756011344877743fdc2a5382bac6e70362d624ccf3f654407c1b4badf7d8f9295dd3dabdef65b27677e0',
      '0a2e01c85deae718a530ad8c6d20a84009babe6c8989269e950d8cf440c6e997695e64d455c4174a652cd080f6230b74',
    ]);
    let rtmr1: Buffer = Buffer.alloc(48);
    for (const d of r1)
      rtmr1 = createHash('sha384')
        .update(Buffer.concat([rtmr1, Buffer.from(d, 'hex')]))
        .digest();
    expect(m.rtmr[1]).toBe(rtmr1.toString('hex'));
    expect(m.mrtd).toBe(tdxMrtd(fw));
  });

  it('hardware: the load options of "root=LABEL=cloudimg-rootfs ro console=ttyS0" and RTMR[2] from its published components', () => {
    const m = tdxMeasurements({ firmware: fw, kernel: pe, initrd: Buffer.from('initrd'), cmdline: HW_CMDLINE });
    const r2 = m.events.filter((e) => e.rtmr === 2);
    expect(r2[0]?.digestSha384).toBe(HW_LOAD_OPTIONS);
    expect(r2[1]?.digestSha384).toBe(sha384('initrd'));
    const published = [HW_LOAD_OPTIONS, HW_INITRD_SHA384].map((digestSha384) => ({
      rtmr: 2 as const,
      type: 'EV_EVENT_TAG',
      digestSha384,
      description: '',
    }));
    expect(replayRtmr(published, 2)).toBe(HW_RTMR2);
    expect(m.rtmr[2]).toBe(replayRtmr(m.events, 2));
  });

  it('the legacy loader measures QEMU\'s patched setup header and the command line before " initrd=initrd"', () => {
    // A bzImage-shaped PE: the setup header fields QEMU patches live in the DOS stub area.
    const kernel = buildPe(16, 0x20);
    kernel.writeUInt32LE(0x53726448, 0x202); // "HdrS"
    kernel.writeUInt16LE(0x20f, 0x206);
    kernel[0x211] = 1; // LOADED_HIGH
    kernel.writeUInt32LE(0x7fffffff, 0x22c);
    kernel[0x1f1] = 1;
    const input = { firmware: fw, kernel, initrd: Buffer.alloc(4096), cmdline: 'console=hvc0' };
    const current = tdxMeasurements(input);
    const legacy = tdxMeasurements({ ...input, kernelLoader: { legacy: { ramBelow4GiBBytes: 512 << 20 } } });
    const wide = (s: string) => Buffer.from(s, 'utf16le');
    expect(current.events[5]?.digestSha384).toBe(sha384(wide('initrd=initrd console=hvc0\0')));
    expect(legacy.events[5]?.digestSha384).toBe(sha384(wide('console=hvc0 initrd=initrd\0')));
    expect(legacy.events[0]?.digestSha384).not.toBe(current.events[0]?.digestSha384);
    expect(legacy.mrtd).toBe(current.mrtd);
  });

  it('MRCONFIGID is reported beside the registers, never folded in; RTMR[0] and RTMR[3] say why they are not predicted', () => {
    const base = { firmware: fw, kernel: pe, initrd: Buffer.from('x'), cmdline: '' };
    const plain = tdxMeasurements(base);
    const bound = tdxMeasurements({ ...base, mrConfigId: Buffer.alloc(48, 7) });
    expect(bound.mrtd).toBe(plain.mrtd);
    expect(bound.rtmr).toEqual(plain.rtmr);
    expect(bound.mrConfigId).toBe('07'.repeat(48));
    expect(plain.rtmr[0]).toBeNull();
    expect(plain.rtmr[3]).toBeNull();
    expect(Object.keys(plain.unpredicted)).toEqual(['0', '3']);
    const noKernel = tdxMeasurements({ firmware: fw });
    expect(noKernel.rtmr).toEqual([null, null, null, null]);
    expect(noKernel.mrtd).toBe(plain.mrtd);
    // trustee's default policy names; unpredicted registers and MRCONFIGID are left out.
    expect(tdxReferenceValues(bound)).toEqual({ mr_td: plain.mrtd, rtmr_1: plain.rtmr[1], rtmr_2: plain.rtmr[2] });
    expect(tdxReferenceValues(noKernel)).toEqual({ mr_td: plain.mrtd });
  });

  it('bad input is refused naming the field', () => {
    expectKataError(() => tdxMeasurements({ firmware: fw, mrConfigId: Buffer.alloc(32) }), 'MEASURE_TEE_INPUT_INVALID', /mrConfigId/);
    expectKataError(() => tdxMeasurements({ firmware: fw, cmdline: 'x' }), 'MEASURE_TEE_INPUT_INVALID', /kernel/);
    expectKataError(
      () => tdxMeasurements({ firmware: fw, kernel: pe, initrd: Buffer.alloc(1), cmdline: 'a\0b' }),
      'MEASURE_TEE_INPUT_INVALID',
      /cmdline/,
    );
    expectKataError(
      () => tdxMeasurements({ firmware: fw, kernel: Buffer.from('not a PE'), initrd: Buffer.alloc(1) }),
      'MEASURE_PE_MALFORMED',
    );
  });
});
