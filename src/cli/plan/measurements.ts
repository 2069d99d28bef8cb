/**
 * `kata-ts plan --measurements`: the launch measurements a pod's VM will have, predicted from the
 * very argv the plan gives QEMU (its -kernel, -initrd, -append, -m, pflash units and tpm device)
 * and the files those name, before anything boots. The result is the reference-values document
 * (src/measure/reference-values.ts); text and RVPS forms are views of it.
 */
import { gunzipSync } from 'node:zlib';
import { invalid } from '../../common/errors.js';
import { q35RamBelow4GiBBytes } from '../../measure/bzimage.js';
import { sha256 } from '../../measure/pcr.js';
import { REFERENCE_VALUES_SCHEMA, type ReferenceValues, rvpsSampleMessage, vtpmReferenceValues } from '../../measure/reference-values.js';
import { predictVtpm } from '../../measure/vtpm.js';
import '../reasons.js';
import type { PlanReport } from './output.js';

/** The pod annotations that carry an initdata document (gzip, then base64): Kata's and kata-ts's own. */
export const INITDATA_ANNOTATIONS = ['io.katacontainers.config.hypervisor.cc_init_data', 'io.kata-ts.initdata'] as const;

/** What a vtpm launch's measurements are computed from, as the argv names it. */
export interface ArgvLaunchInputs {
  kernelPath: string;
  initrdPath: string;
  cmdline: string;
  memoryBytes: number;
  ovmfCodePath: string;
  /** The pod's copy of the vars; made from the configured template, which is what is read. */
  ovmfVarsCopyPath: string;
  hasTpm: boolean;
}

const MiB = 1024 * 1024;
const UNITS: Record<string, number> = { '': MiB, K: 1024, M: MiB, G: 1024 * MiB, T: 1024 * 1024 * MiB };

function optionAfter(argv: readonly string[], flag: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length - 1; i++) if (argv[i] === flag) out.push(argv[i + 1] ?? '');
  return out;
}

function keyValues(value: string): Map<string, string> {
  // QEMU option syntax: key=value pairs separated by commas; a literal comma is doubled.
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
    throw invalid('PLAN_MEASUREMENTS_UNAVAILABLE', `the planned -m value "${value}" has no size kata-ts can read`);
  return Number(m[1]) * unit;
}

/** Reads the launch inputs out of a planned argv (pure). */
export function launchInputsFromArgv(argv: readonly string[]): ArgvLaunchInputs {
  const one = (flag: string): string => {
    const values = optionAfter(argv, flag);
    if (values.length !== 1 || values[0] === undefined)
      throw invalid('PLAN_MEASUREMENTS_UNAVAILABLE', `the planned argv has ${values.length} ${flag} options, not one`);
    return values[0];
  };
  const pflash = optionAfter(argv, '-drive')
    .map(keyValues)
    .filter((kv) => kv.get('if') === 'pflash');
  const unit = (n: string): string | undefined => pflash.find((kv) => (kv.get('unit') ?? '0') === n)?.get('file');
  return {
    kernelPath: one('-kernel'),
    initrdPath: one('-initrd'),
    cmdline: optionAfter(argv, '-append')[0] ?? '',
    memoryBytes: qemuMemoryBytes(one('-m')),
    ovmfCodePath: unit('0') ?? '',
    ovmfVarsCopyPath: unit('1') ?? '',
    hasTpm:
      optionAfter(argv, '-device').some((d) => d.startsWith('tpm-crb')) &&
      optionAfter(argv, '-tpmdev').some((d) => d.startsWith('emulator')),
  };
}

/**
 * The initdata document of a pod, from its annotations (gzip + base64, Kata's encoding), or null.
 * Two annotations that disagree are refused: which one the guest would get is not a guess.
 */
export function initdataFromAnnotations(annotations: Record<string, string> | undefined): Buffer | null {
  const docs = INITDATA_ANNOTATIONS.filter((k) => annotations?.[k] !== undefined).map((k) => {
    try {
      return { key: k, doc: gunzipSync(Buffer.from(annotations?.[k] ?? '', 'base64')) };
    } catch {
      throw invalid('PLAN_MEASUREMENTS_UNAVAILABLE', `annotation ${k} is not gzip + base64`);
    }
  });
  const [first, second] = docs;
  if (first === undefined) return null;
  if (second !== undefined && !second.doc.equals(first.doc))
    throw invalid('PLAN_MEASUREMENTS_UNAVAILABLE', `annotations ${first.key} and ${second.key} carry different initdata documents`);
  return first.doc;
}

export interface MeasurementSources {
  report: PlanReport;
  /** The configured OVMF vars template (the pod's copy is made from it at boot). */
  ovmfVarsTemplatePath: string;
  annotations?: Record<string, string>;
  /** Reads a file the argv names (the CLI's I/O, injected). */
  read: (path: string) => Buffer;
}

/** The reference values of a planned vtpm pod; a coded error when its VM has no vTPM. */
export function plannedReferenceValues(src: MeasurementSources): ReferenceValues {
  const inputs = launchInputsFromArgv(src.report.qemu.argv);
  if (!inputs.hasTpm || inputs.ovmfCodePath === '')
    throw invalid(
      'PLAN_MEASUREMENTS_UNAVAILABLE',
      `handler ${src.report.handler}'s VM has no vTPM (its tee profile is not vtpm here): nothing is measured to predict`,
    );
  const kernel = src.read(inputs.kernelPath);
  const initrd = src.read(inputs.initrdPath);
  const vars = src.read(src.ovmfVarsTemplatePath);
  const code = src.read(inputs.ovmfCodePath);
  const initdata = initdataFromAnnotations(src.annotations);
  const ramBelow4GiBBytes = q35RamBelow4GiBBytes(inputs.memoryBytes);
  const prediction = predictVtpm({
    kernel,
    initrd,
    cmdline: inputs.cmdline,
    ramBelow4GiBBytes,
    ovmfVars: vars,
    ...(initdata === null ? {} : { initdataDigestSha256: sha256(initdata) }),
  });
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: src.report.pod,
    handler: src.report.handler,
    tee: 'vtpm',
    inputs: {
      kernelSha256: sha256(kernel).toString('hex'),
      initrdSha256: sha256(initrd).toString('hex'),
      cmdline: inputs.cmdline,
      ramBelow4GiBBytes,
      ovmfCodeSha256: sha256(code).toString('hex'),
      ovmfVarsSha256: sha256(vars).toString('hex'),
      ...(initdata === null ? {} : { initdataSha256: sha256(initdata).toString('hex') }),
    },
    vtpm: vtpmReferenceValues(prediction),
  };
}

/** The text view of a reference-values document. */
export function measurementsText(doc: ReferenceValues): string {
  const lines = [
    `Measurements of pod ${doc.pod.namespace}/${doc.pod.name} (handler ${doc.handler}, tee ${doc.tee}), predicted before boot`,
    `  kernel   sha256 ${doc.inputs.kernelSha256}`,
    `  initrd   sha256 ${doc.inputs.initrdSha256}`,
    `  cmdline  ${doc.inputs.cmdline}`,
    `  RAM below 4 GiB ${doc.inputs.ramBelow4GiBBytes} bytes`,
  ];
  if (doc.inputs.initdataSha256 !== undefined) lines.push(`  initdata sha256 ${doc.inputs.initdataSha256}`);
  const vtpm = doc.vtpm;
  if (vtpm !== undefined) {
    lines.push('', `vTPM PCRs (${vtpm.bank} bank):`);
    for (const [pcr, value] of Object.entries(vtpm.pcrs)) {
      lines.push(`  PCR ${pcr.padStart(2)}  ${value}`);
      for (const e of vtpm.events.filter((ev) => String(ev.pcr) === pcr))
        lines.push(`           ${e.type} ${e.digestSha256}  ${e.description}`);
    }
    lines.push('', 'Not predicted (fixed by the firmware build, its vars and the device set; take them from a known-good boot):');
    for (const f of vtpm.notPredicted) lines.push(`  PCR ${String(f.pcr).padStart(2)}  ${f.why}`);
  }
  return `${lines.join('\n')}\n`;
}

/** The output of `plan --measurements` in one of its formats. */
export function measurementsOutput(doc: ReferenceValues, format: 'text' | 'json' | 'rvps'): string {
  if (format === 'json') return `${JSON.stringify(doc, null, 2)}\n`;
  if (format === 'rvps') return `${JSON.stringify(rvpsSampleMessage(doc), null, 2)}\n`;
  return measurementsText(doc);
}
