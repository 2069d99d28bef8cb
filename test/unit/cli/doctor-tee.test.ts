import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { teeChecks } from '../../../src/cli/doctor-tee.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { parseConfigDocument } from '../../../src/config/load.js';
import { guestImageVerityDocument } from '../../../src/hypervisor/index.js';

// A guest image with its dm-verity metadata beside it, and one without.
const dir = mkdtempSync(path.join(os.tmpdir(), 'doctor-tee-'));
const verifiedImage = path.join(dir, 'guest.img');
writeFileSync(verifiedImage, '');
writeFileSync(
  `${verifiedImage}.verity.json`,
  JSON.stringify(guestImageVerityDocument({ rootHash: 'ab'.repeat(32), salt: 'cd'.repeat(32), dataBlocks: 10, hashStartBlock: 10 })),
);
const unverifiedImage = path.join(dir, 'bare.img');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const no = { ok: false, message: 'no such hardware' };
const yes = { ok: true, message: 'present' };
const DEBIAN_12 = { major: 7, minor: 2, micro: 22 };
const tcg = { accel: 'tcg' as const, reason: 'test' };

describe('doctor: TEE checks', () => {
  it("says Debian 12's QEMU cannot start SNP or TDX, and kata-ts-cvm resolves to vtpm", async () => {
    const config = defaultConfig();
    // The firmware and swtpm of a fresh config are Debian's paths; point them at files that exist.
    config.hypervisor.firmware.ovmfCodePath = '/etc/hostname';
    config.hypervisor.firmware.ovmfVarsPath = '/etc/hostname';
    config.hypervisor.tpm.swtpmBinary = '/bin/sh';
    config.hypervisor.tpm.swtpmSetupBinary = '/bin/sh';
    config.hypervisor.guestImagePath = verifiedImage;
    const checks = await teeChecks(config, { acceleration: tcg, tee: { host: { snp: no, tdx: no }, qemuVersion: DEBIAN_12 } });
    const by = Object.fromEntries(checks.map((c) => [c.name, c]));
    expect(by['tee-snp']).toMatchObject({ verdict: 'warn' });
    expect(by['tee-snp']?.message).toContain('QEMU 7.2.22 cannot start SEV-SNP guests (9.1.0 or later is needed)');
    expect(by['tee-tdx']?.message).toContain('(10.1.0 or later is needed)');
    expect(by['tee:kata-ts-cvm']).toEqual({
      name: 'tee:kata-ts-cvm',
      verdict: 'ok',
      message: 'tee.kind auto -> vtpm (no SNP or TDX on this host)',
    });
    expect(by['tee:kata-ts']).toBeUndefined();
  });

  it('fails a handler set to snp that this QEMU cannot start, and a vtpm handler whose firmware is missing', async () => {
    const config = parseConfigDocument(
      {
        handlers: { 'kata-ts-cvm': { tee: { kind: 'snp' } } },
        hypervisor: { firmware: { ovmfCodePath: '/nonexistent/OVMF_CODE.fd' } },
      },
      'test',
    );
    const checks = await teeChecks(config, { acceleration: tcg, tee: { host: { snp: yes, tdx: no }, qemuVersion: DEBIAN_12 } });
    const cvm = checks.find((c) => c.name === 'tee:kata-ts-cvm');
    expect(cvm?.verdict).toBe('fail');
    expect(cvm?.message).toMatch(/pods are refused: QEMU 7\.2\.22 cannot start SEV-SNP/);
    config.handlers['kata-ts-cvm']!.tee.kind = 'vtpm';
    const vtpm = (await teeChecks(config, { acceleration: tcg })).find((c) => c.name === 'tee:kata-ts-cvm');
    expect(vtpm?.verdict).toBe('fail');
    expect(vtpm?.message).toContain('missing /nonexistent/OVMF_CODE.fd');
  });

  it("fails a TEE handler whose guest image has no dm-verity metadata (its pods are refused), and names a malformed one's field", async () => {
    const config = defaultConfig();
    config.hypervisor.firmware.ovmfCodePath = '/etc/hostname';
    config.hypervisor.firmware.ovmfVarsPath = '/etc/hostname';
    config.hypervisor.tpm.swtpmBinary = '/bin/sh';
    config.hypervisor.tpm.swtpmSetupBinary = '/bin/sh';
    config.hypervisor.guestImagePath = unverifiedImage;
    const cvm = (await teeChecks(config, { acceleration: tcg })).find((c) => c.name === 'tee:kata-ts-cvm');
    expect(cvm?.verdict).toBe('fail');
    expect(cvm?.message).toContain(`missing ${unverifiedImage}.verity.json`);
    writeFileSync(`${unverifiedImage}.verity.json`, JSON.stringify({ schema: 'kata-ts/guest-image-verity/v1', version: 0 }));
    const bad = (await teeChecks(config, { acceleration: tcg })).find((c) => c.name === 'tee:kata-ts-cvm');
    expect(bad?.verdict).toBe('fail');
    expect(bad?.message).toContain('guest image verity version must be 1');
  });
});
