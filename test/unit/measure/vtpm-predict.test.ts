/**
 * PCR arithmetic, the event digests of a vtpm launch (load options as UTF-16, UEFI variable
 * data, separators) and how predictVtpm composes them. The fixed vectors below are digests read
 * from the TCG event log of a live OVMF + swtpm boot on this project's test machines (QEMU 7.2,
 * OVMF 2022.11); they depend only on the text hashed, not on any installed file.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULT_GUEST_DIR } from '../../../src/config/defaults.js';
import { authenticodeSha256 } from '../../../src/measure/authenticode.js';
import { patchSetupHeader } from '../../../src/measure/bzimage.js';
import {
  EFI_GLOBAL_VARIABLE_GUID,
  EFI_IMAGE_SECURITY_DATABASE_GUID,
  guidBytes,
  guidText,
  secureBootPolicyVariables,
} from '../../../src/measure/ovmf-vars.js';
import { extendPcr, replayPcrs, SEPARATOR_DIGEST_SHA256, sha256, ZERO_PCR_SHA256 } from '../../../src/measure/pcr.js';
import { efiLoadOptions, efiVariableDataDigest, predictVtpm, type VtpmLaunchInput } from '../../../src/measure/vtpm.js';
import { thrown } from '../../helpers/kata-error.js';

const KERNEL = path.join(process.env.KATA_TS_GUEST_DIR ?? DEFAULT_GUEST_DIR, 'vmlinuz');
const VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';
const VARS_MS = '/usr/share/OVMF/OVMF_VARS_4M.ms.fd';
const MiB = 1024 * 1024;

describe('PCR arithmetic', () => {
  it('extends as sha256(old || digest) from zero, PCR by PCR', () => {
    const d1 = sha256('a');
    const d2 = sha256('b');
    const one = createHash('sha256')
      .update(Buffer.concat([Buffer.alloc(32), d1]))
      .digest();
    const two = createHash('sha256')
      .update(Buffer.concat([one, d2]))
      .digest();
    expect(extendPcr(ZERO_PCR_SHA256, d1)).toEqual(one);
    const events = [
      { pcr: 4, type: 'X', digestSha256: d1.toString('hex'), description: '' },
      { pcr: 9, type: 'X', digestSha256: d2.toString('hex'), description: '' },
      { pcr: 4, type: 'X', digestSha256: d2.toString('hex'), description: '' },
    ];
    expect(replayPcrs(events, [4, 8, 9])).toEqual({
      4: two.toString('hex'),
      8: '0'.repeat(64),
      9: extendPcr(ZERO_PCR_SHA256, d2).toString('hex'),
    });
  });

  it('the separator is sha256 of four zero bytes (as logged: df3f6198...)', () => {
    expect(SEPARATOR_DIGEST_SHA256.toString('hex')).toBe('df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119');
  });
});

describe('event digests', () => {
  it('load options: the -append text plus " initrd=initrd", UTF-16LE, with a UTF-16 NUL', () => {
    const options = efiLoadOptions('console=ttyS0 quiet panic=-1');
    expect(options).toEqual(Buffer.from('console=ttyS0 quiet panic=-1 initrd=initrd\0', 'utf16le'));
    // The LOADED_IMAGE::LoadOptions event of a live boot with this -append.
    expect(sha256(options).toString('hex')).toBe('5e0ce2240f9b711350ba045dc401b962587abaa582b3da0d32585801138bc683');
  });

  it('load options widen each byte of the -append text, as OVMF does, so UTF-8 is not re-encoded', () => {
    const options = efiLoadOptions('é');
    // é is C3 A9 in UTF-8: two code units U+00C3 U+00A9, not one U+00E9.
    expect(options.subarray(0, 4)).toEqual(Buffer.from([0xc3, 0, 0xa9, 0]));
    expect(thrown(() => efiLoadOptions('a\0b')).reason).toBe('MEASURE_CMDLINE_INVALID');
  });

  it('UEFI variable data digests equal the EV_EFI_VARIABLE_DRIVER_CONFIG events of a live boot', () => {
    expect(efiVariableDataDigest(EFI_GLOBAL_VARIABLE_GUID, 'SecureBoot', Buffer.from([0])).toString('hex')).toBe(
      '115aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d8',
    );
    expect(efiVariableDataDigest(EFI_GLOBAL_VARIABLE_GUID, 'PK', Buffer.alloc(0)).toString('hex')).toBe(
      'dea7b80ab53a3daaa24d5cc46c64e1fa9ffd03739f90aadbd8c0867c4a5b4890',
    );
    expect(efiVariableDataDigest(EFI_IMAGE_SECURITY_DATABASE_GUID, 'dbx', Buffer.alloc(0)).toString('hex')).toBe(
      '9f75b6823bff6af1024a4e2036719cdd548d3cbc2bf1de8e7ef4d0ed01f94bf9',
    );
  });

  it('GUIDs round-trip through their mixed-endian byte form', () => {
    expect(guidBytes(EFI_GLOBAL_VARIABLE_GUID).toString('hex')).toBe('61dfe48bca93d211aa0d00e098032b8c');
    expect(guidText(guidBytes(EFI_IMAGE_SECURITY_DATABASE_GUID))).toBe(EFI_IMAGE_SECURITY_DATABASE_GUID);
  });
});

describe.skipIf(!existsSync(VARS))('OVMF vars files', () => {
  it("Debian's plain vars enroll no Secure Boot keys; the .ms vars enroll PK, KEK, db, dbx", () => {
    expect(secureBootPolicyVariables(readFileSync(VARS))).toEqual([]);
    if (existsSync(VARS_MS)) expect(secureBootPolicyVariables(readFileSync(VARS_MS)).sort()).toEqual(['KEK', 'PK', 'db', 'dbx']);
  });

  it('refuses a file that is no firmware volume, or whose store is not the authenticated layout', () => {
    expect(thrown(() => secureBootPolicyVariables(Buffer.alloc(4096))).reason).toBe('MEASURE_VARS_MALFORMED');
    const other = Buffer.from(readFileSync(VARS));
    other[other.readUInt16LE(0x30)] = 0; // the store GUID's first byte: not the authenticated layout
    expect(thrown(() => secureBootPolicyVariables(other)).message).toMatch(/not an authenticated one/);
  });
});

describe.skipIf(!existsSync(KERNEL))('predictVtpm', () => {
  const kernel = existsSync(KERNEL) ? readFileSync(KERNEL) : Buffer.alloc(0);
  const initrd = Buffer.from('an initrd stands in here: predictVtpm hashes it, nothing parses it');
  const base: VtpmLaunchInput = { kernel, initrd, cmdline: 'console=ttyS0 quiet', ramBelow4GiBBytes: 512 * MiB };

  it('PCR 4 is the patched kernel, the boot-option action and a separator; PCR 9 the load options then the initrd', () => {
    const p = predictVtpm(base);
    const kernelHash = authenticodeSha256(
      patchSetupHeader(kernel, { cmdline: base.cmdline, initrdBytes: initrd.length, ramBelow4GiBBytes: 512 * MiB }).image,
    );
    let pcr4 = extendPcr(ZERO_PCR_SHA256, kernelHash);
    pcr4 = extendPcr(pcr4, sha256('Calling EFI Application from Boot Option'));
    pcr4 = extendPcr(pcr4, sha256(Buffer.alloc(4)));
    const pcr9 = extendPcr(extendPcr(ZERO_PCR_SHA256, sha256(efiLoadOptions(base.cmdline))), sha256(initrd));
    expect(p.pcrs[4]).toBe(pcr4.toString('hex'));
    expect(p.pcrs[9]).toBe(pcr9.toString('hex'));
    expect(p.pcrs[8]).toBe('0'.repeat(64));
    expect(p.pcrs[7]).toBeUndefined();
    expect(p.firmwarePcrs.map((f) => f.pcr)).toEqual([0, 1, 2, 3, 5, 6, 7]);
    expect(p.events.map((e) => `${e.pcr}:${e.type}`)).toEqual([
      '4:EV_EFI_BOOT_SERVICES_APPLICATION',
      '4:EV_EFI_ACTION',
      '4:EV_SEPARATOR',
      '9:EV_EVENT_TAG',
      '9:EV_EVENT_TAG',
    ]);
  });

  it('one byte of the command line changes PCR 9 only; of the initrd PCR 9 (its size PCR 4 too); of the kernel PCR 4; initdata PCR 8', () => {
    const p = predictVtpm(base).pcrs;
    const diff = (q: Record<number, string>): number[] => [4, 8, 9].filter((n) => q[n] !== p[n]);
    expect(diff(predictVtpm({ ...base, cmdline: 'console=ttyS0 quieT' }).pcrs)).toEqual([9]);
    const initrd2 = Buffer.from(initrd);
    initrd2[0] = (initrd2[0] ?? 0) ^ 1;
    // The initrd's content reaches PCR 9 only; its size also moves its address in the kernel's header (PCR 4).
    expect(diff(predictVtpm({ ...base, initrd: initrd2 }).pcrs)).toEqual([9]);
    expect(diff(predictVtpm({ ...base, initrd: Buffer.concat([initrd, Buffer.alloc(4096)]) }).pcrs)).toEqual([4, 9]);
    const kernel2 = Buffer.from(kernel);
    const middle = kernel2.length >> 1;
    kernel2[middle] = (kernel2[middle] ?? 0) ^ 1;
    expect(diff(predictVtpm({ ...base, kernel: kernel2 }).pcrs)).toEqual([4]);
    // The signature appended to Debian's kernel is not hashed: changing it changes nothing.
    const resigned = Buffer.from(kernel);
    resigned[resigned.length - 100] = (resigned[resigned.length - 100] ?? 0) ^ 1;
    expect(diff(predictVtpm({ ...base, kernel: resigned }).pcrs)).toEqual([]);
    const doc = sha256('initdata document');
    const withInitdata = predictVtpm({ ...base, initdataDigestSha256: doc }).pcrs;
    expect(diff(withInitdata)).toEqual([8]);
    // Trustee's TPM verifier checks exactly this: PCR 8 = sha256(32 zero bytes || sha256(document)).
    expect(withInitdata[8]).toBe(sha256(Buffer.concat([Buffer.alloc(32), doc])).toString('hex'));
    // The RAM decides where the initrd goes, hence the kernel's measured header.
    expect(diff(predictVtpm({ ...base, ramBelow4GiBBytes: 1024 * MiB }).pcrs)).toEqual([4]);
  });

  it.skipIf(!existsSync(VARS))('predicts PCR 7 from a vars file without Secure Boot keys, and not from one with keys', () => {
    const p = predictVtpm({ ...base, ovmfVars: readFileSync(VARS) });
    // The live boot's PCR 7 with Debian's OVMF_VARS_4M.fd (secure boot off).
    expect(p.pcrs[7]).toBe('65caf8dd1e0ea7a6347b635d2b379c93b9a1351edc2afc3ecda700e534eb3068');
    expect(p.firmwarePcrs.map((f) => f.pcr)).toEqual([0, 1, 2, 3, 5, 6]);
    if (existsSync(VARS_MS)) {
      const ms = predictVtpm({ ...base, ovmfVars: readFileSync(VARS_MS) });
      expect(ms.pcrs[7]).toBeUndefined();
      expect(ms.firmwarePcrs.find((f) => f.pcr === 7)?.why).toMatch(/PK/);
    }
  });

  it('refuses an empty initrd and an initdata digest of the wrong length, naming the field', () => {
    expect(thrown(() => predictVtpm({ ...base, initrd: Buffer.alloc(0) })).reason).toBe('MEASURE_INITRD_EMPTY');
    const e = thrown(() => predictVtpm({ ...base, initdataDigestSha256: Buffer.alloc(31) }));
    expect(e.reason).toBe('MEASURE_DIGEST_INVALID');
    expect(e.message).toMatch(/initdataDigestSha256/);
  });
});
