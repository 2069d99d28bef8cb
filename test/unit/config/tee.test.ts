import { describe, expect, it } from 'vitest';
import { defaultConfig } from '../../../src/config/defaults.js';
import { parseConfigDocument } from '../../../src/config/load.js';
import { thrown } from '../../helpers/kata-error.js';

describe('config: TEE profiles, firmware and the vTPM', () => {
  it("kata-ts has no TEE, kata-ts-cvm resolves it per host (auto); firmware and swtpm are Debian's", () => {
    const c = defaultConfig();
    expect(c.handlers['kata-ts']?.tee).toEqual({ kind: 'none' });
    expect(c.handlers['kata-ts-cvm']?.tee).toEqual({ kind: 'auto' });
    expect(c.hypervisor.firmware.ovmfCodePath).toBe('/usr/share/OVMF/OVMF_CODE_4M.fd');
    expect(c.hypervisor.firmware.ovmfVarsPath).toBe('/usr/share/OVMF/OVMF_VARS_4M.fd');
    expect(c.hypervisor.tpm).toEqual({
      swtpmBinary: '/usr/bin/swtpm',
      swtpmSetupBinary: '/usr/bin/swtpm_setup',
      caDir: '/var/lib/kata-ts/tpm-ca',
    });
  });

  it('takes an explicit kind and firmware paths', () => {
    const c = parseConfigDocument(
      { handlers: { 'kata-ts-cvm': { tee: { kind: 'vtpm' } } }, hypervisor: { firmware: { ovmfVarsPath: '/opt/vars.fd' } } },
      'test',
    );
    expect(c.handlers['kata-ts-cvm']?.tee.kind).toBe('vtpm');
    expect(c.hypervisor.firmware.ovmfVarsPath).toBe('/opt/vars.fd');
    expect(c.hypervisor.firmware.ovmfCodePath).toBe('/usr/share/OVMF/OVMF_CODE_4M.fd');
  });

  it('refuses an unknown kind, a relative firmware path and an unknown tpm key, naming each field', () => {
    const kind = thrown(() => parseConfigDocument({ handlers: { 'kata-ts-cvm': { tee: { kind: 'sev' } } } }, 'test'));
    expect(kind.reason).toBe('CONFIG_INVALID');
    expect(kind.message).toContain('/handlers/kata-ts-cvm/tee/kind');
    const fw = thrown(() => parseConfigDocument({ hypervisor: { firmware: { ovmfCodePath: 'OVMF.fd' } } }, 'test'));
    expect(fw.message).toContain('/hypervisor/firmware/ovmfCodePath');
    const tpm = thrown(() => parseConfigDocument({ hypervisor: { tpm: { swtpm: '/usr/bin/swtpm' } } }, 'test'));
    expect(tpm.message).toContain('/hypervisor/tpm');
  });

  it('refuses a TEE on a handler that is not confidential', () => {
    const err = thrown(() => parseConfigDocument({ handlers: { 'kata-ts': { tee: { kind: 'vtpm' } } } }, 'test'));
    expect(err.reason).toBe('CONFIG_INVALID');
    expect(err.message).toContain('/handlers/kata-ts/tee/kind "vtpm" needs a confidential handler');
  });
});
