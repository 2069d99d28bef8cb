/**
 * A planned VM's launch measurements, from the very argv the runtime gives QEMU: its -kernel,
 * -initrd, -append, -m, pflash units and TPM device name everything the vTPM prediction needs,
 * so `kata-ts plan --measurements` and a sandbox's verbose status compute the same values from
 * the same plan. Pure: the caller injects the file reader.
 */
import { invalid } from '../common/errors.js';
import { q35RamBelow4GiBBytes } from './bzimage.js';
import { type Initdata, snpHostData, tdxMrConfigId } from './initdata.js';
import { sha256 } from './pcr.js';
import { REFERENCE_VALUES_SCHEMA, type ReferenceValues, vtpmReferenceValues } from './reference-values.js';
import { cpuSignatureFromCpuinfo, snpMeasurement, snpReferenceValues } from './snp.js';
import { tdxMeasurements, tdxReferenceValues } from './tdx.js';
import './reasons.js';
import { predictVtpm } from './vtpm.js';

/** What a vtpm launch's measurements are computed from, as the argv names it. */
export interface ArgvLaunchInputs {
  kernelPath: string;
  initrdPath: string;
  cmdline: string;
  memoryBytes: number;
  /** pflash unit 0; empty without one. */
  ovmfCodePath: string;
  /** pflash unit 1: the pod's copy of the vars (made from the configured template). */
  ovmfVarsCopyPath: string;
  /** A tpm-crb device on a TPM emulator backend (swtpm). */
  hasTpm: boolean;
}

const MiB = 1024 * 1024;
const UNITS: Record<string, number> = { '': MiB, K: 1024, M: MiB, G: 1024 * MiB, T: 1024 * 1024 * MiB };

function optionValues(argv: readonly string[], flag: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length - 1; i++) if (argv[i] === flag) out.push(argv[i + 1] ?? '');
  return out;
}

/** QEMU option syntax: key=value pairs separated by commas, a literal comma doubled. */
function keyValues(value: string): Map<string, string> {
  const parts: string[] = [];
  let current = '';
  for (let i = 0; i < value.length; i++) {
    const c = value[i];
    if (c === ',' && value[i + 1] === ',') {
      current += ',';
      i++;
    } else if (c === ',') {
      parts.push(current);
      current = '';
    } else {
      current += c;
    }
  }
  parts.push(current);
  return new Map(
    parts.map((p) => {
      const at = p.indexOf('=');
      return at < 0 ? [p, ''] : [p.slice(0, at), p.slice(at + 1)];
    }),
  );
}

/** `-m` as QEMU reads it: `size=416M,maxmem=...` or a bare size; no suffix means MiB. */
export function qemuMemoryBytes(value: string): number {
  const kv = keyValues(value);
  const size = kv.get('size') ?? [...kv.entries()].find(([, v]) => v === '')?.[0] ?? '';
  const m = /^(\d+)([KMGT]?)$/i.exec(size);
  const unit = UNITS[(m?.[2] ?? '').toUpperCase()];
  if (m?.[1] === undefined || unit === undefined)
    throw invalid('MEASURE_ARGV_UNREADABLE', `the planned -m value "${value}" has no size kata-ts can read`);
  return Number(m[1]) * unit;
}

/** Reads the launch inputs out of a planned argv. */
export function launchInputsFromArgv(argv: readonly string[]): ArgvLaunchInputs {
  const one = (flag: string): string => {
    const values = optionValues(argv, flag);
    if (values.length !== 1 || values[0] === undefined)
      throw invalid('MEASURE_ARGV_UNREADABLE', `the planned argv has ${values.length} ${flag} options, not one`);
    return values[0];
  };
  const pflash = optionValues(argv, '-drive')
    .map(keyValues)
    .filter((kv) => kv.get('if') === 'pflash');
  const unit = (n: string): string => pflash.find((kv) => (kv.get('unit') ?? '0') === n)?.get('file') ?? '';
  const appends = optionValues(argv, '-append');
  if (appends.length > 1) throw invalid('MEASURE_ARGV_UNREADABLE', `the planned argv has ${appends.length} -append options, not one`);
  return {
    kernelPath: one('-kernel'),
    initrdPath: one('-initrd'),
    cmdline: appends[0] ?? '',
    memoryBytes: qemuMemoryBytes(one('-m')),
    ovmfCodePath: unit('0'),
    ovmfVarsCopyPath: unit('1'),
    hasTpm:
      optionValues(argv, '-device').some((d) => d.startsWith('tpm-crb')) &&
      optionValues(argv, '-tpmdev').some((d) => d.startsWith('emulator')),
  };
}

export interface PlannedVtpmLaunch {
  argv: readonly string[];
  pod: { name: string; namespace: string; uid: string };
  handler: string;
  /** The configured OVMF vars template (the pod's copy is made from it before boot). */
  ovmfVarsTemplatePath: string;
  /** The pod's initdata document, null without one. */
  initdata: Buffer | null;
  /** Reads a file the argv names, whole. */
  read: (path: string) => Buffer;
}

/** The reference values of a planned vtpm VM; a coded error when its argv has no vTPM. */
export function plannedVtpmReferenceValues(launch: PlannedVtpmLaunch): ReferenceValues {
  const inputs = launchInputsFromArgv(launch.argv);
  if (!inputs.hasTpm || inputs.ovmfCodePath === '')
    throw invalid(
      'MEASURE_NO_VTPM',
      `handler ${launch.handler}'s VM has no vTPM (no OVMF pflash and tpm-crb in its argv): nothing is measured to predict`,
    );
  const kernel = launch.read(inputs.kernelPath);
  const initrd = launch.read(inputs.initrdPath);
  const vars = launch.read(launch.ovmfVarsTemplatePath);
  const code = launch.read(inputs.ovmfCodePath);
  const ramBelow4GiBBytes = q35RamBelow4GiBBytes(inputs.memoryBytes);
  const initdataDigest = launch.initdata === null ? null : sha256(launch.initdata);
  const prediction = predictVtpm({
    kernel,
    initrd,
    cmdline: inputs.cmdline,
    ramBelow4GiBBytes,
    ovmfVars: vars,
    ...(initdataDigest === null ? {} : { initdataDigestSha256: initdataDigest }),
  });
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: launch.pod,
    handler: launch.handler,
    tee: 'vtpm',
    inputs: {
      kernelSha256: sha256(kernel).toString('hex'),
      initrdSha256: sha256(initrd).toString('hex'),
      cmdline: inputs.cmdline,
      ramBelow4GiBBytes,
      ovmfCodeSha256: sha256(code).toString('hex'),
      ovmfVarsSha256: sha256(vars).toString('hex'),
      ...(initdataDigest === null ? {} : { initdataSha256: initdataDigest.toString('hex') }),
    },
    vtpm: vtpmReferenceValues(prediction),
  };
}

/** What an SNP or TDX launch is predicted from, besides the planned argv. */
export interface PlannedHardwareTeeLaunch {
  argv: readonly string[];
  pod: { name: string; namespace: string; uid: string };
  handler: string;
  /** The pod's initdata, null without one: its binding (HOST_DATA / MRCONFIGID) as the runtime derives it. */
  initdata: Initdata | null;
  /** Reads a file the argv names, whole. */
  read: (path: string) => Buffer;
  /** /proc/cpuinfo of the host the pod would run on: `-cpu host` takes its vCPU signature from it. */
  cpuinfo: () => string;
}

/** The `key=` value of the `-object` whose type is `type` (e.g. sev-snp-guest), or undefined. */
function objectOption(argv: readonly string[], type: string, key: string): { found: boolean; value: string | undefined } {
  const obj = optionValues(argv, '-object')
    .map(keyValues)
    .find((kv) => kv.has(type));
  return { found: obj !== undefined, value: obj?.get(key) };
}

/** The inputs both hardware TEEs share: firmware (-bios), kernel, initrd, cmdline. */
function hardwareInputs(launch: PlannedHardwareTeeLaunch) {
  const inputs = launchInputsFromArgv(launch.argv);
  const bios = optionValues(launch.argv, '-bios');
  if (bios.length !== 1 || bios[0] === undefined)
    throw invalid('MEASURE_ARGV_UNREADABLE', `the planned argv has ${bios.length} -bios options, not one`);
  const firmware = launch.read(bios[0]);
  const kernel = launch.read(inputs.kernelPath);
  const initrd = launch.read(inputs.initrdPath);
  const initdataDigest = launch.initdata === null ? null : sha256(launch.initdata.document);
  const common = {
    kernelSha256: sha256(kernel).toString('hex'),
    initrdSha256: sha256(initrd).toString('hex'),
    cmdline: inputs.cmdline,
    ramBelow4GiBBytes: q35RamBelow4GiBBytes(inputs.memoryBytes),
    ...(initdataDigest === null ? {} : { initdataSha256: initdataDigest.toString('hex') }),
  };
  return { inputs, firmware, kernel, initrd, common };
}

/** `-smp cpus=N,...`: the vCPUs at boot. */
function bootVcpus(argv: readonly string[]): number {
  const smp = optionValues(argv, '-smp').map(keyValues)[0];
  const cpus = Number(smp?.get('cpus') ?? [...(smp?.keys() ?? [])][0]);
  if (!Number.isInteger(cpus) || cpus < 1) throw invalid('MEASURE_ARGV_UNREADABLE', 'the planned argv has no -smp cpus= kata-ts can read');
  return cpus;
}

/**
 * The reference values of a planned SEV-SNP VM: the launch digest of the very argv (its -bios
 * OVMF.amdsev, kernel hashes of -kernel/-initrd/-append, one VMSA per boot vCPU of the -cpu model,
 * `host` read from the host's cpuinfo, and QEMU's default SEV features 0x1), with HOST_DATA (the
 * initdata binding) in the argv, reported beside by the hardware and checked by the verifier.
 */
export function plannedSnpReferenceValues(launch: PlannedHardwareTeeLaunch): ReferenceValues {
  const snp = objectOption(launch.argv, 'sev-snp-guest', 'host-data');
  if (!snp.found) throw invalid('MEASURE_ARGV_UNREADABLE', `handler ${launch.handler}'s planned argv has no sev-snp-guest object`);
  const { inputs, firmware, kernel, initrd, common } = hardwareInputs(launch);
  const cpus = optionValues(launch.argv, '-cpu');
  const model = (cpus[0] ?? 'host').split(',')[0] ?? 'host';
  const m = snpMeasurement({
    firmware,
    vcpus: bootVcpus(launch.argv),
    vcpuType: model === 'host' ? cpuSignatureFromCpuinfo(launch.cpuinfo()) : model,
    kernel,
    initrd,
    cmdline: inputs.cmdline,
    ...bindingOf(launch.initdata === null ? null : snpHostData(launch.initdata), snp.value),
    guestFeatures: 0x1,
  });
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: launch.pod,
    handler: launch.handler,
    tee: 'snp',
    inputs: { ...common, ovmfCodeSha256: sha256(firmware).toString('hex') },
    snp: { ...snpReferenceValues(m), ...(m.hostData === undefined ? {} : { host_data: m.hostData }) },
  };
}

/**
 * The reference values of a planned TDX VM: MRTD of its -bios TDVF, RTMR[1] and RTMR[2] of the
 * direct kernel boot (the loader of QEMU 10.1 with a current edk2, which TDX needs), with
 * MRCONFIGID (the initdata binding) from the argv reported beside.
 */
export function plannedTdxReferenceValues(launch: PlannedHardwareTeeLaunch): ReferenceValues {
  const tdx = objectOption(launch.argv, 'tdx-guest', 'mrconfigid');
  if (!tdx.found) throw invalid('MEASURE_ARGV_UNREADABLE', `handler ${launch.handler}'s planned argv has no tdx-guest object`);
  const { inputs, firmware, kernel, initrd, common } = hardwareInputs(launch);
  const m = tdxMeasurements({
    firmware,
    kernel,
    initrd,
    cmdline: inputs.cmdline,
    ...(() => {
      const b = bindingOf(launch.initdata === null ? null : tdxMrConfigId(launch.initdata), tdx.value);
      return b.hostData === undefined ? {} : { mrConfigId: b.hostData };
    })(),
  });
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: launch.pod,
    handler: launch.handler,
    tee: 'tdx',
    inputs: { ...common, ovmfCodeSha256: sha256(firmware).toString('hex') },
    tdx: { ...tdxReferenceValues(m), ...(m.mrConfigId === undefined ? {} : { mr_config_id: m.mrConfigId }) },
  };
}

/**
 * The initdata binding of a launch: derived from the pod's initdata as the runtime derives it for
 * the argv it starts, else what the planned argv carries (base64), else none.
 */
function bindingOf(derived: Buffer | null, inArgv: string | undefined): { hostData?: Buffer } {
  if (derived !== null) return { hostData: derived };
  return inArgv === undefined ? {} : { hostData: Buffer.from(inArgv, 'base64') };
}
