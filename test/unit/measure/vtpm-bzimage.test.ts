/**
 * QEMU 7.2's setup-header patch for direct kernel boot, on synthetic headers: which fields are
 * written, how the initrd's address follows from the initrd's size and the RAM below 4 GiB, the
 * vga= forms, and the refusals QEMU itself would make (as coded errors).
 */
import { describe, expect, it } from 'vitest';
import { patchSetupHeader, QEMU_PC_ACPI_DATA_SIZE_BYTES, q35RamBelow4GiBBytes } from '../../../src/measure/bzimage.js';
import { thrown } from '../../helpers/kata-error.js';

const MiB = 1024 * 1024;

/** A kernel-shaped buffer: 28 setup sectors, the given protocol and flags, patterned payload. */
function fakeBzImage(
  opts: { protocol?: number; loadflags?: number; xloadflags?: number; initrdAddrMax?: number; bytes?: number } = {},
): Buffer {
  const k = Buffer.alloc(opts.bytes ?? 64 * 1024);
  for (let i = 0; i < k.length; i++) k[i] = (i * 7 + 3) & 0xff;
  k[0x1f1] = 28;
  k.writeUInt32LE(0x53726448, 0x202);
  k.writeUInt16LE(opts.protocol ?? 0x20f, 0x206);
  k[0x211] = opts.loadflags ?? 0x01;
  k.writeUInt32LE(opts.initrdAddrMax ?? 0x7fffffff, 0x22c);
  k.writeUInt16LE(opts.xloadflags ?? 0x2, 0x236);
  return k;
}

/** Offsets QEMU may write, with their widths. */
const WRITTEN = [
  [0x1fa, 2],
  [0x210, 1],
  [0x211, 1],
  [0x218, 4],
  [0x21c, 4],
  [0x224, 2],
  [0x228, 4],
] as const;

function changedOffsets(a: Buffer, b: Buffer): number[] {
  const out: number[] = [];
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) out.push(i);
  return out;
}

describe('patchSetupHeader', () => {
  it('writes the loader type, heap, command line pointer and initrd fields, and nothing else', () => {
    const kernel = fakeBzImage();
    const { image, initrdAddress } = patchSetupHeader(kernel, {
      cmdline: 'console=ttyS0',
      initrdBytes: 1_984_000,
      ramBelow4GiBBytes: 512 * MiB,
    });
    expect(image[0x210]).toBe(0xb0);
    expect(image[0x211]).toBe(0x81);
    expect(image.readUInt16LE(0x224)).toBe(0xfe00);
    expect(image.readUInt32LE(0x228)).toBe(0x20000);
    expect(image.readUInt32LE(0x21c)).toBe(1_984_000);
    // Observed on a live boot (512 MiB, this initrd size): OVMF's measured kernel had 0x1fdf3000 here.
    expect(initrdAddress).toBe(0x1fdf3000);
    expect(image.readUInt32LE(0x218)).toBe(0x1fdf3000);
    const allowed = new Set(WRITTEN.flatMap(([at, n]) => Array.from({ length: n }, (_, i) => at + i)));
    expect(changedOffsets(kernel, image).filter((o) => !allowed.has(o))).toEqual([]);
    expect(image.length).toBe(kernel.length);
    // The input is left alone.
    expect(kernel[0x210]).not.toBe(0xb0);
  });

  it('places the initrd at the highest 4 KiB page under low RAM less the ACPI area', () => {
    const kernel = fakeBzImage();
    for (const [ram, size] of [
      [256 * MiB, 1],
      [2048 * MiB, 4096],
      [2048 * MiB, 4097],
      [2816 * MiB, 100 * MiB + 5],
    ] as const) {
      const max = ram - QEMU_PC_ACPI_DATA_SIZE_BYTES - 1;
      const { initrdAddress, initrdMaxAddress } = patchSetupHeader(kernel, { cmdline: '', initrdBytes: size, ramBelow4GiBBytes: ram });
      expect(initrdMaxAddress).toBe(max);
      expect(initrdAddress % 4096).toBe(0);
      expect(initrdAddress + size).toBeLessThanOrEqual(max);
      expect(initrdAddress + 4096 + size).toBeGreaterThan(max);
    }
  });

  it('honours initrd_addr_max of a kernel that cannot load above 4 GiB (protocol < 2.12 or no flag)', () => {
    for (const kernel of [
      fakeBzImage({ protocol: 0x20b, initrdAddrMax: 0x0fffffff }),
      fakeBzImage({ xloadflags: 0, initrdAddrMax: 0x0fffffff }),
    ]) {
      const { initrdMaxAddress } = patchSetupHeader(kernel, { cmdline: '', initrdBytes: MiB, ramBelow4GiBBytes: 1024 * MiB });
      expect(initrdMaxAddress).toBe(0x0fffffff);
    }
  });

  it('writes vid_mode for vga= in every form QEMU accepts', () => {
    const kernel = fakeBzImage();
    const mode = (cmdline: string): number =>
      patchSetupHeader(kernel, { cmdline, initrdBytes: 1, ramBelow4GiBBytes: 256 * MiB }).image.readUInt16LE(0x1fa);
    expect(mode('vga=normal')).toBe(0xffff);
    expect(mode('quiet vga=ext')).toBe(0xfffe);
    expect(mode('vga=ask quiet')).toBe(0xfffd);
    expect(mode('vga=0x317')).toBe(0x317);
    expect(mode('vga=791')).toBe(791);
    expect(mode('vga=010')).toBe(8);
    const before = kernel.readUInt16LE(0x1fa);
    expect(mode('console=ttyS0')).toBe(before);
    expect(thrown(() => mode('vga=12abc')).reason).toBe('MEASURE_CMDLINE_INVALID');
  });

  it('refuses what QEMU refuses, naming the field', () => {
    const kernel = fakeBzImage();
    const e1 = thrown(() => patchSetupHeader(kernel, { cmdline: '', initrdBytes: 300 * MiB, ramBelow4GiBBytes: 256 * MiB }));
    expect(e1.reason).toBe('MEASURE_INITRD_TOO_LARGE');
    expect(thrown(() => patchSetupHeader(kernel, { cmdline: '', initrdBytes: 1, ramBelow4GiBBytes: 5 * 1024 * MiB })).reason).toBe(
      'MEASURE_RAM_INVALID',
    );
    expect(thrown(() => patchSetupHeader(Buffer.alloc(4096), { cmdline: '', initrdBytes: 1, ramBelow4GiBBytes: 256 * MiB })).reason).toBe(
      'MEASURE_BZIMAGE_MALFORMED',
    );
    expect(
      thrown(() => patchSetupHeader(fakeBzImage({ protocol: 0x201 }), { cmdline: '', initrdBytes: 1, ramBelow4GiBBytes: 256 * MiB }))
        .reason,
    ).toBe('MEASURE_BZIMAGE_UNSUPPORTED');
    expect(
      thrown(() => patchSetupHeader(fakeBzImage({ bytes: 4096 }), { cmdline: '', initrdBytes: 1, ramBelow4GiBBytes: 256 * MiB })).message,
    ).toMatch(/setup_sects/);
  });
});

describe('q35RamBelow4GiBBytes', () => {
  it('keeps all RAM low up to 2.75 GiB, then 2 GiB', () => {
    expect(q35RamBelow4GiBBytes(512 * MiB)).toBe(512 * MiB);
    expect(q35RamBelow4GiBBytes(0xb0000000 - 1)).toBe(0xb0000000 - 1);
    expect(q35RamBelow4GiBBytes(0xb0000000)).toBe(0x80000000);
    expect(q35RamBelow4GiBBytes(8 * 1024 * MiB)).toBe(0x80000000);
    expect(thrown(() => q35RamBelow4GiBBytes(0)).reason).toBe('MEASURE_RAM_INVALID');
    // Observed on a live boot with -m 3072 and a 1984000-byte initrd: OVMF's measured kernel had 0x7fdf3000.
    const { initrdAddress } = patchSetupHeader(fakeBzImage(), {
      cmdline: '',
      initrdBytes: 1_984_000,
      ramBelow4GiBBytes: q35RamBelow4GiBBytes(3072 * MiB),
    });
    expect(initrdAddress).toBe(0x7fdf3000);
  });
});
