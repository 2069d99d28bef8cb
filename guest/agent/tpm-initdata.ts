/**
 * The guest's side of the initdata binding on a vtpm pod. The host hands the pod's initdata
 * document over fw_cfg (`opt/org.kata-ts/initdata`, src/hypervisor/argv.ts); before anything in
 * the guest reads or parses it, the agent's start reads its bytes once, extends PCR 8 of the TPM
 * with their sha256 (src/measure/initdata.ts vtpmPcr8 predicts the value), and only then
 * publishes those same bytes, read-only, at /run/kata-ts/initdata.toml. The published copy is the
 * buffer that was hashed, never a second read of fw_cfg, so what is used is what was measured.
 *
 * Once per boot: /run is a tmpfs, and a restarted agent that finds the published copy does not
 * extend again (a second extend would make PCR 8 differ from every prediction). An agent that
 * died between the extend and the publication extends again on its next start: PCR 8 then
 * matches no reference value, which fails attestation rather than passing it wrongly.
 *
 * Without a TPM the document is not published on a vtpm guest (nothing would bind it); SEV-SNP
 * and TDX guests (their guest device present) get it published as is, since HOST_DATA and
 * MRCONFIGID bind it in the launch measurement.
 */
import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { access, chmod, link, mkdir, open, readFile, stat, unlink } from 'node:fs/promises';
import path from 'node:path';
import { unavailable } from '../../src/common/errors.js';
import type { Logger } from '../../src/common/logger.js';
import './reasons.js';
import { TpmClient, type TpmTransport } from './tpm.js';

/** Where the kernel's qemu_fw_cfg module shows the document (module listed in guest/modules.list). */
export const INITDATA_FW_CFG_RAW = '/sys/firmware/qemu_fw_cfg/by_name/opt/org.kata-ts/initdata/raw';
/** Where the measured document is published, read-only. */
export const GUEST_INITDATA_PATH = '/run/kata-ts/initdata.toml';
/** The PCR extended (src/measure/initdata.ts INITDATA_PCR_INDEX). */
export const INITDATA_PCR = 8;
/** Larger than the host accepts (src/measure/initdata.ts): refused rather than read whole. */
const INITDATA_MAX_BYTES = 1024 * 1024;
/** Devices whose presence says the guest is an SEV-SNP or TDX guest. */
const HARDWARE_TEE_DEVICES = ['/dev/sev-guest', '/dev/tdx_guest'];

export interface MeasureInitdataOptions {
  logger: Logger;
  openTpm: () => Promise<TpmTransport>;
  /** Whether a TPM device exists (the vtpm profile). */
  hasTpm: () => Promise<boolean>;
  fwCfgPath?: string;
  outPath?: string;
  teeDevices?: string[];
}

export type InitdataOutcome = 'none' | 'already-published' | 'measured' | 'published-hardware-tee' | 'withheld';

const exists = (p: string): Promise<boolean> =>
  access(p, constants.F_OK).then(
    () => true,
    () => false,
  );

/** Measures and publishes the initdata document when the VM has one (see the file's comment). */
export async function measureInitdata(o: MeasureInitdataOptions): Promise<InitdataOutcome> {
  const src = o.fwCfgPath ?? INITDATA_FW_CFG_RAW;
  const out = o.outPath ?? GUEST_INITDATA_PATH;
  if (!(await exists(src))) return 'none';
  if (await exists(out)) return 'already-published';
  // The size first: the host decides it, and a huge file must not be read into the agent's heap.
  const size = (await stat(src)).size;
  const doc = size > INITDATA_MAX_BYTES ? null : await readFile(src);
  if (doc === null || doc.length > INITDATA_MAX_BYTES) {
    o.logger.error({ bytes: size }, 'the initdata document is larger than any the host sends: not published');
    return 'withheld';
  }
  const digest = createHash('sha256').update(doc).digest();
  if (await o.hasTpm()) {
    const tpm = new TpmClient(await o.openTpm());
    try {
      await tpm.pcrExtend(INITDATA_PCR, digest);
    } finally {
      await tpm.close();
    }
    await publish(out, doc);
    o.logger.info({ pcr: INITDATA_PCR, sha256: digest.toString('hex'), bytes: doc.length }, 'initdata measured into the TPM and published');
    return 'measured';
  }
  for (const dev of o.teeDevices ?? HARDWARE_TEE_DEVICES) {
    if (await exists(dev)) {
      await publish(out, doc);
      o.logger.info({ device: dev, sha256: digest.toString('hex') }, 'initdata published (bound by the launch measurement)');
      return 'published-hardware-tee';
    }
  }
  o.logger.error({ sha256: digest.toString('hex') }, 'initdata present but no TPM and no hardware TEE to bind it: not published');
  throw unavailable('INITDATA_UNMEASURED', 'the VM has an initdata document but no TPM or hardware TEE to bind it; it is not published');
}

/** Writes `doc` read-only under a temporary name and links it into place (all or nothing). */
async function publish(out: string, doc: Buffer): Promise<void> {
  await mkdir(path.dirname(out), { recursive: true, mode: 0o755 });
  const tmp = `${out}.${process.pid}.tmp`;
  const fh = await open(tmp, 'wx', 0o444);
  try {
    await fh.writeFile(doc);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await chmod(tmp, 0o444);
  // link, not rename: an existing copy (a racing start) is never replaced.
  try {
    await link(tmp, out);
  } finally {
    await unlink(tmp);
  }
}
