/**
 * `doctor`'s TEE checks: which hardware TEEs this host and its QEMU can start (SEV-SNP needs QEMU
 * 9.1, TDX 10.1: Debian 12's 7.2 starts neither), what each handler's `tee.kind` resolves to
 * here, and whether a vtpm handler's firmware and swtpm are installed.
 */
import { constants, promises as fsp } from 'node:fs';
import { errorMessage } from '../common/errors.js';
import type { KataConfig } from '../config/types.js';
import { formatQemuVersion, guestImageVerityPath, readGuestImageVerity, TEE_MIN_QEMU, teeLaunchProblem } from '../hypervisor/index.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import { planTee } from '../runtime/plan.js';

/** A check as doctor prints it (a DoctorCheck; declared here, since doctor.ts imports this file). */
export interface TeeCheck {
  name: string;
  verdict: 'ok' | 'warn' | 'fail';
  message: string;
}

const readable = (file: string) =>
  fsp.access(file, constants.R_OK).then(
    () => true,
    () => false,
  );

/** One line per hardware TEE, one per handler with a TEE. */
export async function teeChecks(config: KataConfig, facts: Pick<RuntimeFacts, 'tee' | 'acceleration'>): Promise<TeeCheck[]> {
  const checks: TeeCheck[] = [];
  const tee = facts.tee;
  const version = tee?.qemuVersion ?? null;
  for (const kind of ['snp', 'tdx'] as const) {
    const problem =
      tee === undefined ? 'not checked' : teeLaunchProblem(kind, { host: tee.host, qemuVersion: version, accel: facts.acceleration.accel });
    const needs = `QEMU ${formatQemuVersion(TEE_MIN_QEMU[kind])} or later`;
    checks.push({
      name: `tee-${kind}`,
      // Like TCG: a host without one works, its pods are just not hardware-isolated.
      verdict: problem === null ? 'ok' : 'warn',
      message: problem === null ? `can start ${kind} guests (${needs})` : `cannot start ${kind} guests: ${problem}`,
    });
  }
  for (const [name, profile] of Object.entries(config.handlers).sort(([a], [b]) => a.localeCompare(b))) {
    if (profile.tee.kind === 'none') continue;
    const { plan } = planTee({
      handler: { name, profile },
      hypervisor: config.hypervisor,
      accel: facts.acceleration,
      paths: { qmpSocket: '/doctor/qmp.sock', readySocket: '/doctor/ready.sock', consoleLog: '/doctor/console.log' },
      ...(tee === undefined ? {} : { tee }),
    });
    const missing: string[] = [];
    const files =
      plan.firmware === null
        ? []
        : 'ovmfCode' in plan.firmware
          ? [
              plan.firmware.ovmfCode,
              plan.firmware.ovmfVarsTemplate,
              config.hypervisor.tpm.swtpmBinary,
              config.hypervisor.tpm.swtpmSetupBinary,
            ]
          : [plan.firmware.bios];
    for (const f of files) if (!(await readable(f))) missing.push(f);
    // A TEE pod's /usr is verified against the root hash in this file (RunPodSandbox refuses without it).
    const image = config.hypervisor.guestImagePath;
    if (image !== null) {
      const verity = await readGuestImageVerity(image).catch((err: unknown) => errorMessage(err));
      if (verity === null) missing.push(`${guestImageVerityPath(image)} (the guest image's dm-verity metadata)`);
      else if (typeof verity === 'string') missing.push(`a valid ${guestImageVerityPath(image)} (${verity})`);
    }
    const resolved = `tee.kind ${plan.setting}${plan.setting === plan.kind ? '' : ` -> ${plan.kind}`} (${plan.reason})`;
    if (plan.launchProblem !== null) {
      checks.push({ name: `tee:${name}`, verdict: 'fail', message: `${resolved}: its pods are refused: ${plan.launchProblem}` });
    } else if (missing.length > 0) {
      checks.push({ name: `tee:${name}`, verdict: 'fail', message: `${resolved}: missing ${missing.join(', ')}` });
    } else {
      checks.push({ name: `tee:${name}`, verdict: 'ok', message: resolved });
    }
  }
  return checks;
}
