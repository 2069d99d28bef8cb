/**
 * The Authenticode hash against two independent derivations: osslsigncode's own computation (a
 * separate implementation, on the real guest kernel and on a patched copy), and, for images whose
 * sections are packed back to back, the plain rule "sha256 of the file without the checksum, the
 * certificate directory entry and the certificate table". Synthetic PE files pin the edge rules
 * (section order, gaps, empty sections, trailing data, PE32 vs PE32+).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_GUEST_DIR } from '../../../src/config/defaults.js';
import { authenticodeSha256, parsePeLayout } from '../../../src/measure/authenticode.js';
import { patchSetupHeader } from '../../../src/measure/bzimage.js';
import { thrown } from '../../helpers/kata-error.js';

const KERNEL = path.join(process.env.KATA_TS_GUEST_DIR ?? DEFAULT_GUEST_DIR, 'vmlinuz');
const OSSLSIGNCODE = '/usr/bin/osslsigncode';
const haveKernel = existsSync(KERNEL);
const haveOsslsigncode = existsSync(OSSLSIGNCODE);

const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

const tmp = mkdtempSync(path.join(os.tmpdir(), 'authenticode-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** osslsigncode's "Calculated message digest" of a signed PE file (it prints one per signature). */
function osslsigncodeDigest(file: string): string {
  let out: string;
  try {
    out = execFileSync(OSSLSIGNCODE, ['verify', '-in', file], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    // A signature that no longer verifies (a patched copy) exits non-zero but still prints the digest.
    out = String((err as { stdout?: string }).stdout ?? '');
  }
  const m = /Calculated message digest\s*:\s*([0-9A-Fa-f]{64})/.exec(out);
  if (m?.[1] === undefined) throw new Error(`osslsigncode printed no calculated digest for ${file}:\n${out}`);
  return m[1].toLowerCase();
}

interface SyntheticSection {
  name: string;
  at: number;
  bytes: number;
}

/**
 * A minimal PE image: MZ header, PE signature, COFF header, an optional header (PE32 or PE32+)
 * with 16 data directories, the given section headers and random content everywhere else.
 */
function syntheticPe(opts: { plus: boolean; sections: SyntheticSection[]; fileBytes: number; sizeOfHeaders: number; certBytes: number }): {
  image: Buffer;
  checksumAt: number;
  certDirAt: number;
} {
  const image = Buffer.alloc(opts.fileBytes);
  for (let i = 0; i < image.length; i++) image[i] = (i * 131 + 7) & 0xff;
  const pe = 0x80;
  image.writeUInt16LE(0x5a4d, 0);
  image.writeUInt32LE(pe, 0x3c);
  image.writeUInt32LE(0x00004550, pe);
  const coff = pe + 4;
  const optBytes = opts.plus ? 240 : 224;
  image.writeUInt16LE(opts.sections.length, coff + 2);
  image.writeUInt16LE(optBytes, coff + 16);
  const opt = coff + 20;
  image.writeUInt16LE(opts.plus ? 0x20b : 0x10b, opt);
  image.writeUInt32LE(opts.sizeOfHeaders, opt + 60);
  image.writeUInt32LE(16, opt + (opts.plus ? 108 : 92));
  const certDirAt = opt + (opts.plus ? 112 : 96) + 32;
  image.writeUInt32LE(opts.fileBytes - opts.certBytes, certDirAt);
  image.writeUInt32LE(opts.certBytes, certDirAt + 4);
  opts.sections.forEach((s, i) => {
    const at = opt + optBytes + i * 40;
    image.fill(0, at, at + 8);
    image.write(s.name, at, 'latin1');
    image.writeUInt32LE(s.bytes, at + 16);
    image.writeUInt32LE(s.at, at + 20);
  });
  return { image, checksumAt: opt + 64, certDirAt };
}

describe('authenticodeSha256 on synthetic images', () => {
  for (const plus of [true, false]) {
    it(`${plus ? 'PE32+' : 'PE32'}: headers minus checksum and cert entry, sections by file offset, trailing data minus the certificate table`, () => {
      // Out of table order, a gap between .b and .a, an empty section, 64 trailing bytes, 32 bytes of certificate.
      const sections = [
        { name: '.a', at: 0x600, bytes: 0x100 },
        { name: '.empty', at: 0x300, bytes: 0 },
        { name: '.b', at: 0x400, bytes: 0x180 },
      ];
      const { image, checksumAt, certDirAt } = syntheticPe({
        plus,
        sections,
        fileBytes: 0x700 + 64 + 32,
        sizeOfHeaders: 0x400,
        certBytes: 32,
      });
      const sum = 0x400 + 0x180 + 0x100;
      const expected = createHash('sha256')
        .update(image.subarray(0, checksumAt))
        .update(image.subarray(checksumAt + 4, certDirAt))
        .update(image.subarray(certDirAt + 8, 0x400))
        .update(image.subarray(0x400, 0x580))
        .update(image.subarray(0x600, 0x700))
        // EDK2 starts the trailing part at SumOfBytesHashed, not at the end of the last section.
        .update(image.subarray(sum, image.length - 32))
        .digest('hex');
      expect(authenticodeSha256(image).toString('hex')).toBe(expected);
      expect(parsePeLayout(image).sections.map((s) => s.name)).toEqual(['.b', '.a']);
    });
  }

  it('changing the checksum or the certificate entry does not change the hash; any hashed byte does', () => {
    const { image, checksumAt, certDirAt } = syntheticPe({
      plus: true,
      sections: [{ name: '.text', at: 0x200, bytes: 0x200 }],
      fileBytes: 0x400,
      sizeOfHeaders: 0x200,
      certBytes: 0,
    });
    const base = authenticodeSha256(image).toString('hex');
    const copy = Buffer.from(image);
    copy.writeUInt32LE(0xdeadbeef, checksumAt);
    copy.writeUInt32LE(0x1234, certDirAt);
    expect(authenticodeSha256(copy).toString('hex')).toBe(base);
    const flipped = Buffer.from(image);
    flipped[0x300] = (flipped[0x300] ?? 0) ^ 1;
    expect(authenticodeSha256(flipped).toString('hex')).not.toBe(base);
  });

  it('refuses files that are not PE images, or whose headers point outside the file, with MEASURE_PE_MALFORMED', () => {
    expect(thrown(() => authenticodeSha256(Buffer.alloc(64))).reason).toBe('MEASURE_PE_MALFORMED');
    const { image } = syntheticPe({
      plus: true,
      sections: [{ name: '.text', at: 0x200, bytes: 0x400 }],
      fileBytes: 0x400,
      sizeOfHeaders: 0x200,
      certBytes: 0,
    });
    expect(thrown(() => authenticodeSha256(image)).message).toMatch(/section ".text" lies outside the file/);
    const big = syntheticPe({ plus: true, sections: [], fileBytes: 0x300, sizeOfHeaders: 0x200, certBytes: 0x200 });
    expect(thrown(() => authenticodeSha256(big.image)).message).toMatch(/certificate table is larger/);
  });
});

describe.skipIf(!haveKernel)('authenticodeSha256 on the real guest kernel', () => {
  const kernel = haveKernel ? readFileSync(KERNEL) : Buffer.alloc(0);

  it.skipIf(!haveOsslsigncode)('equals osslsigncode, before and after QEMU patches its setup header', () => {
    expect(authenticodeSha256(kernel).toString('hex')).toBe(osslsigncodeDigest(KERNEL));
    const patched = patchSetupHeader(kernel, { cmdline: 'console=ttyS0', initrdBytes: 3_000_000, ramBelow4GiBBytes: 1 << 30 }).image;
    const file = path.join(tmp, 'patched-vmlinuz');
    writeFileSync(file, patched);
    const ours = authenticodeSha256(patched).toString('hex');
    expect(ours).toBe(osslsigncodeDigest(file));
    expect(ours).not.toBe(authenticodeSha256(kernel).toString('hex'));
  });

  it('equals sha256 of the file without the skipped fields when its sections are packed back to back', () => {
    const layout = parsePeLayout(kernel);
    let next = layout.sizeOfHeaders;
    for (const s of layout.sections) {
      expect(s.pointerToRawData, `section ${s.name} follows the one before it`).toBe(next);
      next += s.sizeOfRawData;
    }
    expect(layout.certDirectoryOffset).not.toBeNull();
    const cert = layout.certDirectoryOffset ?? 0;
    const stripped = Buffer.concat([
      kernel.subarray(0, layout.checksumOffset),
      kernel.subarray(layout.checksumOffset + 4, cert),
      kernel.subarray(cert + 8, kernel.length - layout.certTableBytes),
    ]);
    expect(authenticodeSha256(kernel).toString('hex')).toBe(sha256(stripped));
  });
});
