/**
 * The Intel TDX measurements a pod would have when QEMU (>= 10.1, `tdx-guest`) launches it with
 * TDVF (OVMF.inteltdx) and `-kernel/-initrd/-append`, predicted on the host.
 *
 * MRTD is the SHA-384 (one running hash, finalized at TDH.MR.FINALIZE) of what the TDX module
 * records while the hypervisor builds the TD from the TDVF descriptor's sections, in the
 * descriptor's order, page by page:
 *   - TDH.MEM.PAGE.ADD of each page (unless the section is PAGE_AUG, accepted later by the
 *     guest): a 128-byte block "MEM.PAGE.ADD", zero padded, with the page's GPA (u64) at 16;
 *   - then, for sections with the EXTENDMR attribute, TDH.MR.EXTEND of each 256-byte chunk of
 *     that page: a 128-byte block "MR.EXTEND" with the chunk's GPA at 16, then the chunk.
 * (Upstream QEMU and KVM add and extend one page at a time, which is the order above; early
 * out-of-tree stacks added every page first, which gives another MRTD.)
 *
 * RTMR[1] and RTMR[2] are extended by the firmware during a direct kernel boot, like PCRs
 * 2-6 and 8-15 of a TPM, with SHA-384 (rtmr = sha384(rtmr || digest), from 48 zero bytes):
 *   RTMR[1]: the kernel's Authenticode SHA-384, "Calling EFI Application from Boot Option",
 *            a separator (4 zero bytes), "Exit Boot Services Invocation",
 *            "Exit Boot Services Returned with Success";
 *   RTMR[2]: the kernel's load options (the -append text and "initrd=initrd", UTF-16LE with a
 *            NUL; see TdxKernelLoader for their order), then the initrd file.
 * These event sequences are those of virtee/tdx-measure (src/kernel.rs) and
 * aleph-im/aleph-vm (rust/crates/aleph-tee/src/tdx/measure.rs), both compared with live TDs;
 * this implementation is ours. RTMR[0] (TD HOB, the firmware's own variable
 * store, QEMU's ACPI tables and boot variables) is not predicted: it needs QEMU's exact ACPI
 * tables for the machine shape. RTMR[3] belongs to the guest's run time.
 */
import { createHash } from 'node:crypto';
import { invalid } from '../common/errors.js';
import { authenticodeDigest } from './authenticode.js';
import { patchSetupHeader } from './bzimage.js';
import { parseTdvfMetadata, TDVF_ATTRIBUTE_EXTEND_MR, TDVF_ATTRIBUTE_PAGE_AUG, type TdvfSection } from './ovmf-metadata.js';
import './reasons.js';
import { efiLoadOptions } from './vtpm.js';

const PAGE_BYTES = 4096;
const MR_EXTEND_CHUNK_BYTES = 256;
const BLOCK_BYTES = 128;
const SHA384_BYTES = 48;

function sha384(data: Buffer | string): Buffer {
  return createHash('sha384').update(data).digest();
}

function operationBlock(name: string, gpa: number): Buffer {
  const block = Buffer.alloc(BLOCK_BYTES);
  block.write(name, 0, 'latin1');
  block.writeBigUInt64LE(BigInt(gpa), 16);
  return block;
}

/** The section's bytes as they sit in guest memory: its raw data, then zeros. */
function sectionPage(firmware: Buffer, section: TdvfSection, page: number): Buffer {
  const out = Buffer.alloc(PAGE_BYTES);
  const from = page * PAGE_BYTES;
  const available = Math.max(0, Math.min(PAGE_BYTES, section.rawDataBytes - from));
  if (available > 0) firmware.copy(out, 0, section.dataOffset + from, section.dataOffset + from + available);
  return out;
}

/** MRTD (hex) of a TD built from this TDVF image; pure. */
export function tdxMrtd(firmware: Buffer, sections: TdvfSection[] = parseTdvfMetadata(firmware)): string {
  const mrtd = createHash('sha384');
  for (const section of sections) {
    const extend = (section.attributes & TDVF_ATTRIBUTE_EXTEND_MR) !== 0;
    const add = (section.attributes & TDVF_ATTRIBUTE_PAGE_AUG) === 0;
    for (let page = 0; page < section.memoryBytes / PAGE_BYTES; page++) {
      const gpa = section.memoryAddress + page * PAGE_BYTES;
      if (add) mrtd.update(operationBlock('MEM.PAGE.ADD', gpa));
      if (!extend) continue;
      const bytes = sectionPage(firmware, section, page);
      for (let at = 0; at < PAGE_BYTES; at += MR_EXTEND_CHUNK_BYTES) {
        mrtd.update(operationBlock('MR.EXTEND', gpa + at));
        mrtd.update(bytes.subarray(at, at + MR_EXTEND_CHUNK_BYTES));
      }
    }
  }
  return mrtd.digest('hex');
}

/** One event a TDVF firmware extends into an RTMR during a direct kernel boot. */
export interface RtmrEvent {
  rtmr: 1 | 2;
  /** The TCG event type the firmware logs it with. */
  type: string;
  digestSha384: string;
  description: string;
}

/**
 * Which QEMU/edk2 generation loads the kernel, which decides the kernel bytes and the load
 * options the firmware measures:
 * - 'current' (the default; QEMU >= 10.0 with edk2 >= 2025.05, as a TDX launch needs QEMU >= 10.1
 *   and Debian ships edk2 2026.08): QEMU offers the unpatched kernel as fw_cfg `etc/boot/kernel`
 *   and edk2's QemuKernelLoaderFsDxe loads it (tianocore/edk2 PR #6211), so the kernel is
 *   measured as the file is; the load options are "initrd=initrd " followed by the command line.
 *   Both facts are checked against hardware vectors of QEMU 10.2.4 with edk2-stable202602
 *   (test/unit/measure/tdx.test.ts).
 * - legacy: older pairs measure QEMU's setup-header patch of the kernel (which depends on the
 *   initrd's size and the RAM below 4 GiB) and the command line followed by " initrd=initrd",
 *   as this repository's vTPM prediction checks live with QEMU 7.2 and edk2 2022.11.
 *
 * Not covered: a kernel started through `-shim` (Secure Boot: Debian's OVMF.inteltdx.ms.fd has
 * it enabled with Microsoft's keys) adds shim's own events to RTMR[1].
 */
export type TdxKernelLoader = 'current' | { legacy: { ramBelow4GiBBytes: number } };

/** Inputs of a TDX launch. */
export interface TdxLaunchInput {
  /** The TDVF image given to QEMU's `-bios` (OVMF.inteltdx). */
  firmware: Buffer;
  /** The `-kernel` file: a bzImage with a PE/COFF (EFI stub) header. */
  kernel?: Buffer;
  /** The `-initrd` file. */
  initrd?: Buffer;
  /** Exactly the `-append` text. */
  cmdline?: string;
  /** Defaults to 'current'. */
  kernelLoader?: TdxKernelLoader;
  /**
   * MRCONFIGID (48 bytes, the initdata binding), given to `tdx-guest,mrconfigid=`. Not part
   * of MRTD or the RTMRs: the TDX module copies it into the TD report beside them, so a
   * verifier checks it as a value of its own.
   */
  mrConfigId?: Buffer;
}

/** What a TD quote of this launch is predicted to carry. */
export interface TdxMeasurements {
  /** MRTD, hex. */
  mrtd: string;
  /**
   * RTMR[0..3] after boot, hex; null where kata-ts does not predict the register
   * (see `unpredicted`).
   */
  rtmr: [string | null, string | null, string | null, string | null];
  /** Why each null register is null. */
  unpredicted: Record<number, string>;
  /** The events that make RTMR[1] and RTMR[2], in order. */
  events: RtmrEvent[];
  /** MRCONFIGID as given, hex, reported alongside (not measured). */
  mrConfigId?: string;
  /** The TDVF sections MRTD covers. */
  sections: TdvfSection[];
}

/** Replays RTMR events from reset (48 zero bytes). */
export function replayRtmr(events: readonly RtmrEvent[], rtmr: 1 | 2): string {
  let value: Buffer = Buffer.alloc(SHA384_BYTES);
  for (const e of events) {
    if (e.rtmr === rtmr) value = sha384(Buffer.concat([value, Buffer.from(e.digestSha384, 'hex')]));
  }
  return value.toString('hex');
}

function bad(message: string): never {
  throw invalid('MEASURE_TEE_INPUT_INVALID', message);
}

/** The load options of the 'current' loader: UTF-16LE, one code unit per byte, with a NUL. */
function currentLoadOptions(cmdline: string): Buffer {
  if (cmdline.includes('\0')) bad('cmdline must not contain a NUL character');
  const bytes = Buffer.concat([Buffer.from('initrd=initrd ', 'latin1'), Buffer.from(cmdline, 'utf8'), Buffer.alloc(1)]);
  const wide = Buffer.alloc(bytes.length * 2);
  for (const [i, b] of bytes.entries()) wide.writeUInt16LE(b, i * 2);
  return wide;
}

function measuredKernelAndOptions(input: TdxLaunchInput, kernel: Buffer, initrd: Buffer, cmdline: string): [Buffer, Buffer] {
  const loader = input.kernelLoader ?? 'current';
  if (loader === 'current') return [kernel, currentLoadOptions(cmdline)];
  const { ramBelow4GiBBytes } = loader.legacy;
  return [patchSetupHeader(kernel, { cmdline, initrdBytes: initrd.length, ramBelow4GiBBytes }).image, efiLoadOptions(cmdline)];
}

function bootEvents(input: TdxLaunchInput, kernel: Buffer, initrd: Buffer, cmdline: string): RtmrEvent[] {
  const event = (rtmr: 1 | 2, type: string, digest: Buffer, description: string): RtmrEvent => ({
    rtmr,
    type,
    digestSha384: digest.toString('hex'),
    description,
  });
  const action = (text: string) => event(1, 'EV_EFI_ACTION', sha384(text), text);
  const [measuredKernel, loadOptions] = measuredKernelAndOptions(input, kernel, initrd, cmdline);
  return [
    event(1, 'EV_EFI_BOOT_SERVICES_APPLICATION', authenticodeDigest(measuredKernel, 'sha384'), 'the kernel (Authenticode SHA-384)'),
    action('Calling EFI Application from Boot Option'),
    event(1, 'EV_SEPARATOR', sha384(Buffer.alloc(4)), 'separator'),
    action('Exit Boot Services Invocation'),
    action('Exit Boot Services Returned with Success'),
    event(2, 'EV_EVENT_TAG', sha384(loadOptions), 'the kernel load options: the command line and initrd=initrd (UTF-16LE)'),
    event(2, 'EV_EVENT_TAG', sha384(initrd), 'the initrd'),
  ];
}

/**
 * Predicts MRTD and, for a direct kernel boot with an initrd, RTMR[1] and RTMR[2] of a QEMU
 * TDX launch; reports MRCONFIGID beside them. Pure: reads only the given buffers.
 */
export function tdxMeasurements(input: TdxLaunchInput): TdxMeasurements {
  if (input.mrConfigId !== undefined && input.mrConfigId.length !== 48) {
    bad(`mrConfigId must be 48 bytes, got ${input.mrConfigId.length}`);
  }
  if (input.kernel === undefined && (input.initrd !== undefined || input.cmdline !== undefined)) {
    bad('initrd and cmdline need a kernel');
  }
  const sections = parseTdvfMetadata(input.firmware);
  if (!sections.some((s) => s.kind === 'BFV' && (s.attributes & TDVF_ATTRIBUTE_EXTEND_MR) !== 0)) {
    throw invalid('MEASURE_FIRMWARE_UNSUPPORTED', 'firmware has no measured BFV section in its TDVF metadata');
  }
  const unpredicted: Record<number, string> = {
    0: 'RTMR[0] (TD HOB, the firmware variable store, QEMU ACPI tables, boot variables) is not predicted by kata-ts',
    3: 'RTMR[3] is extended by the guest at run time',
  };
  let events: RtmrEvent[] = [];
  if (input.kernel === undefined) {
    unpredicted[1] = 'no direct kernel boot: the boot loader decides RTMR[1]';
    unpredicted[2] = 'no direct kernel boot: the boot loader decides RTMR[2]';
  } else if (input.initrd === undefined) {
    unpredicted[1] = 'a direct boot without an initrd is not predicted';
    unpredicted[2] = 'a direct boot without an initrd is not predicted';
  } else {
    events = bootEvents(input, input.kernel, input.initrd, input.cmdline ?? '');
  }
  const result: TdxMeasurements = {
    mrtd: tdxMrtd(input.firmware, sections),
    rtmr: [null, events.length > 0 ? replayRtmr(events, 1) : null, events.length > 0 ? replayRtmr(events, 2) : null, null],
    unpredicted,
    events,
    sections,
  };
  if (input.mrConfigId !== undefined) result.mrConfigId = input.mrConfigId.toString('hex');
  return result;
}

/**
 * The reference values a verifier loads for this prediction, under the names trustee's default
 * EAR policy reads (attestation-service/src/token/ear_default_policy.rego: `mr_td`, `rtmr_1`,
 * `rtmr_2` from `input.tdx.quote.body`); registers kata-ts does not predict are left out, and
 * MRCONFIGID too (trustee's verifier checks it against the initdata digest itself). The `tdx`
 * object of the kata-ts reference-values document.
 */
export function tdxReferenceValues(m: TdxMeasurements): Record<string, string> {
  const out: Record<string, string> = { mr_td: m.mrtd };
  if (m.rtmr[1] !== null) out.rtmr_1 = m.rtmr[1];
  if (m.rtmr[2] !== null) out.rtmr_2 = m.rtmr[2];
  return out;
}
