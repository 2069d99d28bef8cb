/**
 * The `vtpm` profile's per-pod parts on the host: the pod's copy of OVMF's variable store and
 * its swtpm (src/tpm/swtpm.ts), started before QEMU as an identity of its own, in the pod's
 * cgroup beside QEMU, recorded, and ended with the VM. The swtpm process itself (its
 * confinement, the EK and its certificate) is src/tpm's; this file only places it in a pod.
 */
import { constants, promises as fsp } from 'node:fs';
import { precondition } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { isSameLiveProcess, type VmmIdentity } from '../../hypervisor/index.js';
import { initdataFromAnnotations } from '../../measure/initdata.js';
import type { SandboxRun, SwtpmHandle } from './create-types.js';
import { leaseOwnerOf, VmmIdentities } from './identities.js';
import { releaseJail } from './jail.js';
import { sandboxTpmJailDir, sandboxTpmSocketDir, sandboxWorkDir } from './paths.js';
import type { SandboxRecord } from './record.js';
import { attachSwtpmProcess } from './tpm-launcher.js';

/**
 * Before QEMU starts, for a vtpm pod: OVMF's vars copied into QEMU's own dir (for its identity:
 * OVMF writes its variables there), then swtpm started for the pod with an identity of its own
 * and its control socket connectable by QEMU's. Each effect registers its undo first. Returns
 * swtpm's handle (undefined for any other TEE).
 */
export async function startPodTpm(run: SandboxRun, qemu: VmmIdentity | undefined): Promise<SwtpmHandle | undefined> {
  const tee = run.record.plan.tee;
  if (tee === undefined || tee.kind !== 'vtpm' || tee.firmware === null || !('ovmfCode' in tee.firmware) || tee.tpm === null) {
    return undefined;
  }
  const { firmware, tpm } = tee;
  const { layout, req } = run.prep;
  // Inside the work dir (or QEMU's dir in it): removed with it. EXCL: nothing is reused.
  await fsp.copyFile(firmware.ovmfVarsTemplate, firmware.ovmfVarsCopy, constants.COPYFILE_EXCL);
  await fsp.chmod(firmware.ovmfVarsCopy, 0o600);
  if (qemu !== undefined) await fsp.chown(firmware.ovmfVarsCopy, qemu.uid, qemu.gid);

  const own = await swtpmIdentity(run, qemu);
  // swtpm's state dir is its own (0700); the socket's dir is swtpm's too, entered by QEMU's group
  // (src/tpm/swtpm.ts takes both over). Both exist before swtpm's jail binds them.
  await fsp.mkdir(tpm.stateDir, { mode: 0o700 });
  const socketDir = sandboxTpmSocketDir(layout.workDir);
  await fsp.mkdir(socketDir, { mode: 0o750 });
  const { hypervisor } = run.deps.config;
  let jail: { jailDir: string } | undefined;
  if (own !== undefined) {
    await fsp.chown(tpm.stateDir, own.uid, own.gid);
    await fsp.chown(socketDir, own.uid, qemu?.gid ?? own.gid);
    // Its own jail, as QEMU has (the work dir is root's 0700: swtpm reaches only what is bound).
    const jailDir = sandboxTpmJailDir(layout.workDir);
    run.undo.push("release swtpm's jail", () => run.launchers.releaseJail(jailDir, run.log));
    const spec = await run.launchers.swtpmJailSpec({
      jailDir,
      stateDir: tpm.stateDir,
      ctrlSocketPath: tpm.socketPath,
      binary: hypervisor.tpm.swtpmBinary,
    });
    await run.launchers.buildJail(spec, own);
    jail = { jailDir };
  }
  const swtpm = await run.launchers.startSwtpm({
    stateDir: tpm.stateDir,
    ctrlSocketPath: tpm.socketPath,
    logFile: tpm.logFile,
    caDir: hypervisor.tpm.caDir,
    binary: hypervisor.tpm.swtpmBinary,
    setupBinary: hypervisor.tpm.swtpmSetupBinary,
    logger: run.log,
    ...(own === undefined ? {} : { identity: own }),
    ...(jail === undefined ? {} : { jail }),
    ...(qemu === undefined ? {} : { clientIdentity: qemu }),
  });
  run.undo.push('stop swtpm', () => swtpm.stop());
  const lease = own === undefined ? null : { uid: own.uid, gid: own.gid, lease: leaseFileOf(run, own.uid) };
  run.record.tpm = {
    pid: swtpm.pid,
    startTimeTicks: swtpm.startTimeTicks,
    ctrlSocketPath: swtpm.ctrlSocketPath,
    stateDir: tpm.stateDir,
    logFile: tpm.logFile,
    identity: lease,
    ekCertPem: swtpm.ekCertPem,
  };
  await run.persist();
  run.log.info({ pid: swtpm.pid, uid: own?.uid }, 'swtpm started for the pod');
  req.signal.throwIfAborted();
  return swtpm;
}

function identitiesOf(run: SandboxRun): VmmIdentities {
  return run.deps.identities ?? new VmmIdentities(run.deps.config.hypervisor.vmmIdentities, run.log);
}

function leaseFileOf(run: SandboxRun, uid: number): string {
  return identitiesOf(run).leaseFile(uid);
}

/**
 * The pod's initdata document where the plan hands it to the guest (fw_cfg): root's, 0644 (QEMU
 * reads it through its jail's bind of this one file), written before QEMU starts; the work dir
 * takes it along. The bytes are the annotation's, decoded again from the recorded spec.
 */
export async function writePodInitdata(run: SandboxRun): Promise<void> {
  const file = run.record.plan.tee?.initdataPath ?? null;
  if (file === null) return;
  const initdata = initdataFromAnnotations(run.record.spec.annotations);
  if (initdata === null) throw new Error('the plan names an initdata file but the pod has no initdata annotation');
  await fsp.writeFile(file, initdata.document, { mode: 0o644, flag: 'wx' });
}

/**
 * swtpm's own identity, leased from the same range as QEMU's (never QEMU's: a QEMU taken over by
 * its guest must not reach the TPM's state); none when QEMU runs as root (the handler opted out).
 * Recorded in `tpm.identity` once swtpm runs; a crash before that is found by the lease's owner.
 */
async function swtpmIdentity(run: SandboxRun, qemu: VmmIdentity | undefined): Promise<VmmIdentity | undefined> {
  if (qemu === undefined) return undefined;
  const identities = identitiesOf(run);
  const owner = leaseOwnerOf(run.deps.store, run.prep.req.id);
  const identity = await identities.acquire(owner);
  run.undo.push('release the swtpm identity', () => identities.release(identity.uid, owner));
  return identity;
}

/** The vtpm pod's firmware and swtpm must be there before anything is made (prepare). */
export async function checkTpmFiles(files: Record<string, string>): Promise<void> {
  for (const [field, file] of Object.entries(files)) {
    try {
      await fsp.access(file, constants.R_OK);
    } catch {
      throw precondition('TEE_FIRMWARE_MISSING', `${field} ${file} is missing: a vtpm pod cannot boot without it.`, {
        details: { field, path: file },
      });
    }
  }
}

/**
 * End the pod's swtpm if it still runs (pid + start time: a reused pid is never signalled; it
 * normally leaves by itself once QEMU closes the control connection), remove its socket and
 * state, and release its jail's mounts. A failure fails the stop, which is retried.
 */
export async function stopPodTpm(record: SandboxRecord, stateDir: string, log: Logger): Promise<void> {
  const t = record.tpm;
  if (t === undefined || t === null) return;
  if (isSameLiveProcess(t.pid, t.startTimeTicks)) log.info({ pid: t.pid }, 'stopping swtpm');
  await (await attachSwtpmProcess(t)).stop();
  if (t.identity !== null) await releaseJail(sandboxTpmJailDir(sandboxWorkDir(stateDir, record.id)), log);
}

/** After a restart: the pod's swtpm must still be the recorded process (its QEMU holds its socket). */
export function checkPodTpm(record: SandboxRecord, log: Logger): void {
  const t = record.tpm;
  if (t === undefined || t === null) return;
  if (isSameLiveProcess(t.pid, t.startTimeTicks)) log.info({ pid: t.pid }, 'swtpm re-attached');
  else log.error({ pid: t.pid }, "swtpm is gone: the guest's TPM no longer answers");
}
