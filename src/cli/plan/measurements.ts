/**
 * `kata-ts plan --measurements`: the launch measurements a pod's VM will have, predicted from the
 * very argv the plan gives QEMU and the files it names (src/measure/launch.ts), before anything
 * boots. The result is the reference-values document (src/measure/reference-values.ts); text and
 * RVPS forms are views of it. The initdata document comes from the pod's annotations.
 */
import { initdataFromAnnotations } from '../../measure/initdata.js';
import { plannedSnpReferenceValues, plannedTdxReferenceValues, plannedVtpmReferenceValues } from '../../measure/launch.js';
import { type ReferenceValues, rvpsSampleMessage } from '../../measure/reference-values.js';
import '../reasons.js';
import type { PlanReport } from './output.js';

export interface MeasurementSources {
  report: PlanReport;
  /** The configured OVMF vars template (the pod's copy is made from it at boot). */
  ovmfVarsTemplatePath: string;
  annotations?: Record<string, string>;
  /** Reads a file the argv names (the CLI's I/O, injected). */
  read: (path: string) => Buffer;
  /** The host's /proc/cpuinfo (an SNP VM with `-cpu host` takes its vCPU signature from it). */
  cpuinfo: () => string;
}

/**
 * The reference values of a planned pod, predicted from the planned argv: vtpm PCRs; for a pod
 * whose TEE is snp or tdx, the launch digest or MRTD and RTMRs that pod would have on that
 * hardware (whether or not this host could start it: the lab plans for SNP and TDX hosts from
 * any machine). A pod without a TEE gets the launch step's MEASURE_NO_VTPM.
 */
export function plannedReferenceValues(src: MeasurementSources): ReferenceValues {
  const tee = src.report.tee;
  const initdata = initdataFromAnnotations(src.annotations);
  if (tee !== undefined && (tee.kind === 'snp' || tee.kind === 'tdx')) {
    const launch = {
      argv: src.report.qemu.argv,
      pod: src.report.pod,
      handler: src.report.handler,
      initdata,
      read: src.read,
      cpuinfo: src.cpuinfo,
    };
    return tee.kind === 'snp' ? plannedSnpReferenceValues(launch) : plannedTdxReferenceValues(launch);
  }
  const firmware = tee?.firmware;
  const template =
    firmware !== null && firmware !== undefined && 'ovmfVarsTemplate' in firmware ? firmware.ovmfVarsTemplate : src.ovmfVarsTemplatePath;
  return plannedVtpmReferenceValues({
    argv: src.report.qemu.argv,
    pod: src.report.pod,
    handler: src.report.handler,
    ovmfVarsTemplatePath: template,
    initdata: initdata?.document ?? null,
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
  for (const [name, values] of [
    ['SEV-SNP (attestation report)', doc.snp],
    ['TDX (TD quote)', doc.tdx],
  ] as const) {
    if (values === undefined) continue;
    lines.push('', `${name}:`);
    for (const [k, v] of Object.entries(values)) lines.push(`  ${k.padEnd(22)} ${v}`);
  }
  if (doc.tdx !== undefined) lines.push("  (RTMR[0] and RTMR[3] are not predicted: QEMU's ACPI tables and the guest's run-time events)");
  return `${lines.join('\n')}\n`;
}

/** The output of `plan --measurements` in one of its formats. */
export function measurementsOutput(doc: ReferenceValues, format: 'text' | 'json' | 'rvps'): string {
  if (format === 'json') return `${JSON.stringify(doc, null, 2)}\n`;
  if (format === 'rvps') return `${JSON.stringify(rvpsSampleMessage(doc), null, 2)}\n`;
  return measurementsText(doc);
}
