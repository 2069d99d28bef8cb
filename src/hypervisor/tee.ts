/**
 * Which trusted execution environment a VM gets (HandlerTeeConfig): what the host offers, which
 * QEMU can start it, and the resolution of a handler's `auto`. Detection reads a few sysfs/dev
 * paths under injected roots once at start; everything else here is pure.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { TeeKind, TeeKindSetting } from '../config/types.js';
import type { Accelerator } from './accel.js';

/** A QEMU release, from `qemu-system-x86_64 --version`. */
export interface QemuVersion {
  major: number;
  minor: number;
  micro: number;
}

/** The oldest QEMU that starts each hardware TEE: SEV-SNP with guest_memfd (9.1), TDX (10.1). */
export const TEE_MIN_QEMU: Record<'snp' | 'tdx', QemuVersion> = {
  snp: { major: 9, minor: 1, micro: 0 },
  tdx: { major: 10, minor: 1, micro: 0 },
};

/** Whether the host can run each hardware TEE, with the sentence that says why (not). */
export interface HostTeeSupport {
  snp: { ok: boolean; message: string };
  tdx: { ok: boolean; message: string };
}

/** Where detection looks; parameters so tests can use temporary trees. */
export interface TeeRoots {
  dev: string;
  sysModule: string;
}

const HOST_ROOTS: TeeRoots = { dev: '/dev', sysModule: '/sys/module' };

/** A kvm module parameter set to true (`Y`, or `1` in older kernels), false when absent. */
function parameterOn(sysModule: string, module: string, parameter: string): boolean {
  try {
    const v = readFileSync(path.join(sysModule, module, 'parameters', parameter), 'utf8').trim();
    return v === 'Y' || v === '1';
  } catch {
    return false;
  }
}

/**
 * SEV-SNP needs the SEV device (/dev/sev) and kvm_amd loaded with `sev_snp` on; TDX needs kvm_intel
 * loaded with `tdx` on. Synchronous: runs once at daemon start and for `doctor`.
 */
export function detectHostTee(roots: TeeRoots = HOST_ROOTS): HostTeeSupport {
  const sevDev = path.join(roots.dev, 'sev');
  const snpParam = path.join(roots.sysModule, 'kvm_amd', 'parameters', 'sev_snp');
  const tdxParam = path.join(roots.sysModule, 'kvm_intel', 'parameters', 'tdx');
  let snp: HostTeeSupport['snp'];
  if (!existsSync(sevDev)) snp = { ok: false, message: `${sevDev} does not exist: no AMD SEV on this host` };
  else if (!parameterOn(roots.sysModule, 'kvm_amd', 'sev_snp')) snp = { ok: false, message: `${snpParam} is not Y: SEV-SNP is off` };
  else snp = { ok: true, message: `${sevDev} exists and ${snpParam} is Y` };
  const tdx = parameterOn(roots.sysModule, 'kvm_intel', 'tdx')
    ? { ok: true, message: `${tdxParam} is Y` }
    : { ok: false, message: `${tdxParam} is not Y: no Intel TDX on this host` };
  return { snp, tdx };
}

/** `QEMU emulator version 7.2.22 (Debian ...)` -> 7.2.22; null when the line says no version. */
export function parseQemuVersion(versionLine: string): QemuVersion | null {
  const m = /version (\d+)\.(\d+)(?:\.(\d+))?/.exec(versionLine);
  if (m === null) return null;
  return { major: Number(m[1]), minor: Number(m[2]), micro: Number(m[3] ?? 0) };
}

/** a >= b. */
export function qemuVersionAtLeast(a: QemuVersion, b: QemuVersion): boolean {
  if (a.major !== b.major) return a.major > b.major;
  if (a.minor !== b.minor) return a.minor > b.minor;
  return a.micro >= b.micro;
}

export function formatQemuVersion(v: QemuVersion): string {
  return `${v.major}.${v.minor}.${v.micro}`;
}

/** A handler's TEE as decided for this host: the kind and why. */
export interface TeeChoice {
  kind: TeeKind;
  reason: string;
}

/**
 * Pure: `auto` becomes `snp` where the host has SEV-SNP, else `tdx` where it has TDX, else `vtpm`;
 * an explicit kind stays what it is (whether it can start is launchProblem's question).
 */
export function resolveTeeKind(setting: TeeKindSetting, host: HostTeeSupport): TeeChoice {
  if (setting !== 'auto') return { kind: setting, reason: `tee.kind is set to ${setting} in the handler profile` };
  if (host.snp.ok) return { kind: 'snp', reason: `AMD SEV-SNP is available (${host.snp.message})` };
  if (host.tdx.ok) return { kind: 'tdx', reason: `Intel TDX is available (${host.tdx.message})` };
  return { kind: 'vtpm', reason: 'no SNP or TDX on this host' };
}

/**
 * Pure: why a VM of `kind` cannot be started here (null: it can). A hardware TEE needs the
 * hardware, KVM and a QEMU new enough to drive it; kata-ts never starts a VM that would claim a
 * TEE it does not have.
 */
export function teeLaunchProblem(
  kind: TeeKind,
  facts: { host: HostTeeSupport; qemuVersion: QemuVersion | null; accel: Accelerator },
): string | null {
  if (kind !== 'snp' && kind !== 'tdx') return null;
  const name = kind === 'snp' ? 'SEV-SNP' : 'TDX';
  const min = TEE_MIN_QEMU[kind];
  if (facts.qemuVersion === null) return `the QEMU version is unknown, and ${name} needs QEMU ${formatQemuVersion(min)} or later`;
  if (!qemuVersionAtLeast(facts.qemuVersion, min)) {
    return `QEMU ${formatQemuVersion(facts.qemuVersion)} cannot start ${name} guests (${formatQemuVersion(min)} or later is needed)`;
  }
  const support = facts.host[kind];
  if (!support.ok) return `this host has no ${name}: ${support.message}`;
  if (facts.accel !== 'kvm') return `${name} guests need KVM, but VMs run under ${facts.accel} here`;
  return null;
}
