/**
 * `kata-ts plan --measurements`: the launch measurements a pod's VM will have, predicted from the
 * very argv the plan gives QEMU and the files it names (src/measure/launch.ts), before anything
 * boots. The result is the reference-values document (src/measure/reference-values.ts); text and
 * RVPS forms are views of it. The initdata document comes from the pod's annotations.
 */
import { gunzipSync } from 'node:zlib';
import { invalid, unimplemented } from '../../common/errors.js';
import { plannedVtpmReferenceValues } from '../../measure/launch.js';
import { type ReferenceValues, rvpsSampleMessage } from '../../measure/reference-values.js';
import '../reasons.js';
import type { PlanReport } from './output.js';

/** The pod annotations that carry an initdata document (gzip, then base64): Kata's and kata-ts's own. */
export const INITDATA_ANNOTATIONS = ['io.katacontainers.config.hypervisor.cc_init_data', 'io.kata-ts.initdata'] as const;

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

/**
 * The reference values of a planned pod. vtpm: predicted from the planned argv. A pod whose TEE
 * resolves to snp or tdx gets a coded error saying so (their digests are not wired in here yet),
 * and one without a TEE the launch step's MEASURE_NO_VTPM.
 */
export function plannedReferenceValues(src: MeasurementSources): ReferenceValues {
  const tee = src.report.tee;
  if (tee !== undefined && (tee.kind === 'snp' || tee.kind === 'tdx'))
    throw unimplemented(
      'PLAN_MEASUREMENTS_UNAVAILABLE',
      `handler ${src.report.handler} resolves to ${tee.kind} here; plan --measurements predicts vtpm launches only so far`,
    );
  const firmware = tee?.firmware;
  const template =
    firmware !== null && firmware !== undefined && 'ovmfVarsTemplate' in firmware ? firmware.ovmfVarsTemplate : src.ovmfVarsTemplatePath;
  return plannedVtpmReferenceValues({
    argv: src.report.qemu.argv,
    pod: src.report.pod,
    handler: src.report.handler,
    ovmfVarsTemplatePath: template,
    initdata: initdataFromAnnotations(src.annotations),
    read: src.read,
  });
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
