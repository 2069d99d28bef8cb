/**
 * The vTPM PCRs a pod VM will have, computed on the host before it boots (pure).
 *
 * The launch: QEMU (q35, Debian 12's 7.2) with OVMF (Debian's OVMF_CODE_4M.fd and a copy of a
 * vars file without Secure Boot keys), a swtpm behind tpm-crb, and direct kernel boot. What each
 * predicted PCR receives, in order (checked against a live guest's event log):
 *   PCR 4  EV_EFI_BOOT_SERVICES_APPLICATION  Authenticode SHA-256 of the kernel as QEMU patched it
 *          EV_EFI_ACTION                     "Calling EFI Application from Boot Option"
 *          EV_SEPARATOR                      four zero bytes
 *   PCR 7  EV_EFI_VARIABLE_DRIVER_CONFIG     SecureBoot (one byte 0), then PK, KEK, db, dbx, empty
 *          EV_SEPARATOR                      (only when the vars file is given and holds no keys)
 *   PCR 8  initdata                          sha256 of the initdata document, extended once by the
 *                                            guest before anything reads it (only with initdata)
 *   PCR 9  EV_EVENT_TAG (Linux EFI stub)     the load options OVMF built: the -append text plus
 *                                            " initrd=initrd", widened byte by byte to UTF-16LE
 *                                            with a UTF-16 NUL
 *          EV_EVENT_TAG (Linux EFI stub)     sha256 of the initrd file
 * PCRs 0-3, 5 and 6 (and 7 when not predicted) depend only on the firmware build, the vars file,
 * QEMU's version, machine type and devices: kata-ts does not compute them.
 */
import { invalid } from '../common/errors.js';
import { authenticodeSha256 } from './authenticode.js';
import { patchSetupHeader } from './bzimage.js';
import { EFI_GLOBAL_VARIABLE_GUID, EFI_IMAGE_SECURITY_DATABASE_GUID, guidBytes, secureBootPolicyVariables } from './ovmf-vars.js';
import { type PcrEvent, replayPcrs, SEPARATOR_DIGEST_SHA256, SHA256_BYTES, sha256 } from './pcr.js';
import './reasons.js';

export type { PcrEvent } from './pcr.js';

/** What decides the predicted PCRs: the files and text QEMU is given. */
export interface VtpmLaunchInput {
  kernel: Buffer;
  initrd: Buffer;
  /** Exactly QEMU's -append text. */
  cmdline: string;
  /** What QEMU's x86 loader uses to place the initrd (see q35RamBelow4GiBBytes). */
  ramBelow4GiBBytes: number;
  /** sha256 of the pod's initdata document, when it has one (PCR 8). */
  initdataDigestSha256?: Buffer;
  /** The OVMF vars file the VM starts from; with it, and no Secure Boot keys in it, PCR 7 is predicted. */
  ovmfVars?: Buffer;
}

/** A PCR kata-ts does not predict, and why. */
export interface FirmwarePcr {
  pcr: number;
  why: string;
}

export interface VtpmPrediction {
  bank: 'sha256';
  /** Predicted PCR values, lower-case hex, keyed by PCR index. */
  pcrs: Record<number, string>;
  /** The events that make them, in the order they are extended. */
  events: PcrEvent[];
  /** PCRs fixed by the firmware, its vars and the device set: not predicted. */
  firmwarePcrs: FirmwarePcr[];
  /** Facts of the prediction a reader may want to check (hex digests, addresses). */
  facts: { kernelAuthenticodeSha256: string; initrdSha256: string; initrdAddress: number; loadOptions: string };
}

/** The event type name kata-ts's guest uses for its one PCR 8 extension (it writes no log entry). */
export const INITDATA_EVENT_TYPE = 'KATA_TS_INITDATA';
/** The PCR the guest extends with sha256(initdata document). */
export const INITDATA_PCR = 8;

const CALLING_EFI_APPLICATION = 'Calling EFI Application from Boot Option';
const FIRMWARE_PCR_WHY: Record<number, string> = {
  0: 'firmware code (OVMF_CODE) and its platform events',
  1: 'platform configuration: QEMU machine type, SMBIOS tables, boot variables',
  2: 'option ROMs and drivers the firmware loads: depends on the device set',
  3: 'option ROM configuration (only a separator with OVMF)',
  5: 'GPT/boot-manager data and ExitBootServices events',
  6: 'platform manufacturer events (only a separator with OVMF)',
};

/**
 * The load options OVMF hands the kernel for a direct boot with an initrd: QEMU passes the
 * -append bytes (and a NUL) over fw_cfg, OVMF appends " initrd=initrd" and widens every byte to
 * one UTF-16 code unit, so a non-ASCII byte becomes U+0080..U+00FF, not its Unicode character.
 */
export function efiLoadOptions(cmdline: string): Buffer {
  if (cmdline.includes('\0')) throw invalid('MEASURE_CMDLINE_INVALID', 'cmdline contains a NUL byte, which QEMU cannot pass');
  const bytes = Buffer.concat([Buffer.from(cmdline, 'utf8'), Buffer.from(' initrd=initrd\0', 'latin1')]);
  const wide = Buffer.alloc(bytes.length * 2);
  for (const [i, b] of bytes.entries()) wide.writeUInt16LE(b, i * 2);
  return wide;
}

/** The EV_EFI_VARIABLE_DRIVER_CONFIG digest: sha256 of UEFI_VARIABLE_DATA for one variable. */
export function efiVariableDataDigest(guid: string, name: string, data: Buffer): Buffer {
  const lengths = Buffer.alloc(16);
  lengths.writeBigUInt64LE(BigInt(name.length), 0);
  lengths.writeBigUInt64LE(BigInt(data.length), 8);
  return sha256(Buffer.concat([guidBytes(guid), lengths, Buffer.from(name, 'utf16le'), data]));
}

function event(pcr: number, type: string, digest: Buffer, description: string): PcrEvent {
  return { pcr, type, digestSha256: digest.toString('hex'), description };
}

/** PCR 7's events for a vars file without Secure Boot keys, or the reason it is not predicted. */
function pcr7Events(vars: Buffer | undefined): PcrEvent[] | string {
  if (vars === undefined) return 'Secure Boot policy: no vars file was given to read it from';
  const enrolled = secureBootPolicyVariables(vars);
  if (enrolled.length > 0) return `Secure Boot policy: the vars file enrolls ${enrolled.join(', ')} (not predicted)`;
  const config = (guid: string, name: string, data: Buffer): PcrEvent =>
    event(
      7,
      'EV_EFI_VARIABLE_DRIVER_CONFIG',
      efiVariableDataDigest(guid, name, data),
      `${name} (${data.length} ${data.length === 1 ? 'byte' : 'bytes'})`,
    );
  return [
    config(EFI_GLOBAL_VARIABLE_GUID, 'SecureBoot', Buffer.from([0])),
    config(EFI_GLOBAL_VARIABLE_GUID, 'PK', Buffer.alloc(0)),
    config(EFI_GLOBAL_VARIABLE_GUID, 'KEK', Buffer.alloc(0)),
    config(EFI_IMAGE_SECURITY_DATABASE_GUID, 'db', Buffer.alloc(0)),
    config(EFI_IMAGE_SECURITY_DATABASE_GUID, 'dbx', Buffer.alloc(0)),
    event(7, 'EV_SEPARATOR', SEPARATOR_DIGEST_SHA256, 'end of the pre-OS policy'),
  ];
}

/** Predicts PCRs 4, 8, 9 (and 7 when it can) of a vtpm pod's launch. Pure; throws coded errors. */
export function predictVtpm(input: VtpmLaunchInput): VtpmPrediction {
  if (input.initrd.length === 0) throw invalid('MEASURE_INITRD_EMPTY', 'initrd is empty; a vtpm launch always has one');
  if (input.initdataDigestSha256 !== undefined && input.initdataDigestSha256.length !== SHA256_BYTES)
    throw invalid('MEASURE_DIGEST_INVALID', `initdataDigestSha256 must be ${SHA256_BYTES} bytes, got ${input.initdataDigestSha256.length}`);
  const loadOptions = efiLoadOptions(input.cmdline);
  const patched = patchSetupHeader(input.kernel, {
    cmdline: input.cmdline,
    initrdBytes: input.initrd.length,
    ramBelow4GiBBytes: input.ramBelow4GiBBytes,
  });
  const kernelHash = authenticodeSha256(patched.image);
  const initrdHash = sha256(input.initrd);
  const pcr7 = pcr7Events(input.ovmfVars);

  const events: PcrEvent[] = [
    ...(Array.isArray(pcr7) ? pcr7 : []),
    event(4, 'EV_EFI_BOOT_SERVICES_APPLICATION', kernelHash, 'the kernel (Authenticode, setup header as QEMU patched it)'),
    event(4, 'EV_EFI_ACTION', sha256(CALLING_EFI_APPLICATION), CALLING_EFI_APPLICATION),
    event(4, 'EV_SEPARATOR', SEPARATOR_DIGEST_SHA256, 'end of the pre-OS phase'),
    event(9, 'EV_EVENT_TAG', sha256(loadOptions), 'LOADED_IMAGE::LoadOptions (the command line)'),
    event(9, 'EV_EVENT_TAG', initrdHash, 'Linux initrd'),
    ...(input.initdataDigestSha256 === undefined
      ? []
      : [event(INITDATA_PCR, INITDATA_EVENT_TYPE, input.initdataDigestSha256, 'sha256 of the initdata document, extended by the guest')]),
  ];
  const predicted = [4, ...(Array.isArray(pcr7) ? [7] : []), INITDATA_PCR, 9];
  const firmwarePcrs: FirmwarePcr[] = [0, 1, 2, 3, 5, 6].map((pcr) => ({ pcr, why: FIRMWARE_PCR_WHY[pcr] ?? '' }));
  if (!Array.isArray(pcr7)) firmwarePcrs.push({ pcr: 7, why: pcr7 });
  return {
    bank: 'sha256',
    pcrs: replayPcrs(events, predicted),
    events,
    firmwarePcrs: firmwarePcrs.sort((a, b) => a.pcr - b.pcr),
    facts: {
      kernelAuthenticodeSha256: kernelHash.toString('hex'),
      initrdSha256: initrdHash.toString('hex'),
      initrdAddress: patched.initrdAddress,
      loadOptions: `${input.cmdline} initrd=initrd`,
    },
  };
}
