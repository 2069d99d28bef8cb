/**
 * critest's ginkgo JSON report, read and judged against the ratchet files (pure: text in, data out).
 *
 * - `test/conformance/expected.txt`: full spec names that must pass, one a line (`#` comments).
 * - `test/conformance/not-applicable.txt`: specs a VM runtime cannot honour, each a spec line
 *   followed by one or more indented `reason: ...` lines. kata-ts should refuse them with
 *   INVALID_ARGUMENT, so their failure message is checked for that code, unless the entry has
 *   `accepted: ...` lines saying why the request is accepted (part of it works) and fails later.
 * - `test/conformance/offline-limits.txt`: same format; specs no runtime can pass with the offline
 *   stand-in images (not judged).
 */

/** One critest spec (a ginkgo `It`) as run, or as left out by the focus/skip filters. */
export interface SpecResult {
  /** Ginkgo's full text: the container texts and the leaf text joined by spaces. */
  name: string;
  /** The outermost container, e.g. `[k8s.io] Security Context`. */
  group: string;
  /** Ginkgo's state: passed, failed, skipped, pending, panicked, interrupted, aborted, timedout. */
  state: string;
  /** True when the filters left the spec out (skipped without a message), false when it ran or skipped itself. */
  filtered: boolean;
  runTimeMs: number;
  /** The first line of the failure (or skip) message, null when there is none. */
  message: string | null;
  /** Where critest failed: `file:line`, null when unknown. */
  location: string | null;
}

/** A suite-level node (BeforeSuite, AfterSuite, ...) that did not pass: every spec is then suspect. */
export interface SuiteProblem {
  node: string;
  state: string;
  message: string | null;
}

export interface ParsedReport {
  specs: SpecResult[];
  suiteProblems: SuiteProblem[];
}

interface GinkgoLocation {
  FileName?: string;
  LineNumber?: number;
}

interface GinkgoSpecReport {
  ContainerHierarchyTexts?: string[] | null;
  LeafNodeType?: string;
  LeafNodeText?: string;
  State?: string;
  RunTime?: number;
  Failure?: { Message?: string; Location?: GinkgoLocation; FailureNodeLocation?: GinkgoLocation } | null;
}

interface GinkgoSuiteReport {
  SpecReports?: GinkgoSpecReport[] | null;
  /** Why the whole suite failed beyond its specs: "Interrupted by Timeout", "Interrupted by User", ... */
  SpecialSuiteFailureReasons?: string[] | null;
}

const NS_PER_MS = 1_000_000;
const MESSAGE_MAX_CHARS = 240;

function firstLine(message: string | undefined): string | null {
  if (message === undefined) return null;
  const line = message
    .split('\n')
    .map((l) => l.trim())
    .find((l) => l !== '');
  if (line === undefined) return null;
  return line.length > MESSAGE_MAX_CHARS ? `${line.slice(0, MESSAGE_MAX_CHARS - 3)}...` : line;
}

/** The whole failure message on one line (gRPC codes often sit on the second line of a gomega message). */
function flatMessage(message: string | undefined): string | null {
  if (message === undefined) return null;
  const flat = message.replace(/\s+/g, ' ').trim();
  return flat === '' ? null : flat;
}

/** Specs and suite-level problems from one or more ginkgo JSON reports (one per critest process). */
export function parseReports(docs: unknown[]): ParsedReport {
  const specs: SpecResult[] = [];
  const suiteProblems: SuiteProblem[] = [];
  for (const doc of docs) {
    if (!Array.isArray(doc)) throw new Error('a ginkgo JSON report is an array of suite reports');
    for (const suite of doc as GinkgoSuiteReport[]) {
      // A suite cut short (timeout, interrupt) reports the specs it never reached as skipped, which
      // would read as "filtered": the run must fail instead.
      for (const reason of suite.SpecialSuiteFailureReasons ?? []) suiteProblems.push({ node: 'suite', state: 'failed', message: reason });
      for (const r of suite.SpecReports ?? []) {
        const state = r.State ?? 'unknown';
        const message = r.Failure?.Message;
        if (r.LeafNodeType !== 'It') {
          if (state !== 'passed' && state !== 'skipped')
            suiteProblems.push({ node: r.LeafNodeType ?? 'unknown', state, message: firstLine(message) });
          continue;
        }
        const texts = [...(r.ContainerHierarchyTexts ?? []), r.LeafNodeText ?? ''];
        const loc = r.Failure?.Location;
        specs.push({
          name: texts.join(' '),
          group: r.ContainerHierarchyTexts?.[0] ?? '(top level)',
          state,
          filtered: state === 'skipped' && (message === undefined || message === ''),
          runTimeMs: Math.round((r.RunTime ?? 0) / NS_PER_MS),
          message: state === 'passed' ? null : (flatMessage(message) ?? null),
          location: loc?.FileName !== undefined ? `${loc.FileName}:${loc.LineNumber ?? 0}` : null,
        });
      }
    }
  }
  // With several critest processes each spec appears in every report: the one that ran it wins.
  const byName = new Map<string, SpecResult>();
  for (const s of specs) {
    const seen = byName.get(s.name);
    if (seen === undefined || (seen.filtered && !s.filtered)) byName.set(s.name, s);
  }
  return { specs: [...byName.values()], suiteProblems };
}

/** Spec names of `expected.txt`: one a line, blank lines and `#` comments ignored. */
export function parseExpected(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

export interface NotApplicable {
  name: string;
  reason: string;
  /** Why kata-ts accepts the request although the spec cannot pass ('' when it refuses it). */
  accepted: string;
}

/** `not-applicable.txt`: a spec line, then indented `reason: ...` (and optional `accepted: ...`) lines, each kind joined. */
export function parseNotApplicable(text: string): NotApplicable[] {
  const out: NotApplicable[] = [];
  for (const [i, raw] of text.split('\n').entries()) {
    if (raw.trim() === '' || raw.trim().startsWith('#')) continue;
    if (/^\s/.test(raw)) {
      const m = /^\s+(reason|accepted):\s*(.*)$/.exec(raw);
      const last = out[out.length - 1];
      if (m === null || last === undefined)
        throw new Error(`not-applicable.txt line ${i + 1}: an indented line must be "reason: ..." or "accepted: ..." after a spec`);
      const key = m[1] as 'reason' | 'accepted';
      last[key] = last[key] === '' ? (m[2] ?? '') : `${last[key]} ${m[2] ?? ''}`;
      continue;
    }
    out.push({ name: raw.trim(), reason: '', accepted: '' });
  }
  for (const na of out) if (na.reason === '') throw new Error(`not-applicable.txt: "${na.name}" has no reason`);
  return out;
}

export interface Verdict {
  /** Must-pass specs that ran and did not pass: the ratchet fails. */
  regressions: SpecResult[];
  /** Specs that passed and are not in expected.txt: add them in the same commit. */
  newlyPassing: SpecResult[];
  /** Names in the ratchet files that critest does not have (renamed or misspelled): the ratchet fails. */
  unknownNames: string[];
  /** Names listed both as must-pass and as not applicable: the ratchet fails. */
  contradictions: string[];
  /** Not-applicable specs (not marked accepted) that ran and failed with something other than InvalidArgument. */
  notRefused: SpecResult[];
  /** Must-pass specs the filters left out this run (not checked). */
  notRun: string[];
}

/** Whether a failed spec's message shows kata-ts answered INVALID_ARGUMENT. */
export function refusedAsInvalid(spec: SpecResult): boolean {
  return spec.message !== null && /InvalidArgument|INVALID_ARGUMENT/.test(spec.message);
}

/** The ratchet: compares what ran with the must-pass list, the not-applicable list and the offline limits. */
export function judge(specs: SpecResult[], expected: string[], notApplicable: NotApplicable[], offline: NotApplicable[] = []): Verdict {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const expectedSet = new Set(expected);
  const naSet = new Set(notApplicable.map((n) => n.name));
  const refusedSet = new Set(notApplicable.filter((n) => n.accepted === '').map((n) => n.name));
  const offlineSet = new Set(offline.map((n) => n.name));
  const unknownNames = [...expected, ...notApplicable.map((n) => n.name), ...offline.map((n) => n.name)].filter((n) => !byName.has(n));
  const contradictions = expected.filter((n) => naSet.has(n) || offlineSet.has(n));
  const regressions: SpecResult[] = [];
  const notRun: string[] = [];
  for (const name of expected) {
    const s = byName.get(name);
    if (s === undefined) continue;
    if (s.filtered) notRun.push(name);
    else if (s.state !== 'passed') regressions.push(s);
  }
  const newlyPassing = specs.filter((s) => s.state === 'passed' && !expectedSet.has(s.name));
  const notRefused = specs.filter((s) => refusedSet.has(s.name) && !s.filtered && s.state !== 'passed' && !refusedAsInvalid(s));
  return { regressions, newlyPassing, unknownNames: [...new Set(unknownNames)], contradictions, notRefused, notRun };
}

export function ratchetFails(v: Verdict): boolean {
  return v.regressions.length > 0 || v.unknownNames.length > 0 || v.contradictions.length > 0;
}

export interface Counts {
  passed: number;
  failed: number;
  skipped: number;
}

/** passed / failed (anything that ran and did not pass or skip itself) / skipped (filtered or self-skipped). */
export function count(specs: SpecResult[]): Counts {
  const c = { passed: 0, failed: 0, skipped: 0 };
  for (const s of specs) {
    if (s.state === 'passed') c.passed++;
    else if (s.state === 'skipped' || s.state === 'pending') c.skipped++;
    else c.failed++;
  }
  return c;
}

/** Counts per group (outermost container), in name order. */
export function countByGroup(specs: SpecResult[]): Array<{ group: string } & Counts> {
  const groups = [...new Set(specs.map((s) => s.group))].sort();
  return groups.map((group) => ({ group, ...count(specs.filter((s) => s.group === group)) }));
}

/** The closing line every run ends with; `label` names the run (`standalone`, `containerd`, `containerd + runc`). */
export function closingLine(c: Counts, label: string): string {
  return `conformance (${label}): ${c.passed} passed, ${c.failed} failed, ${c.skipped} skipped`;
}

const MARK: Record<string, string> = { passed: 'PASS', failed: 'FAIL', skipped: 'SKIP', pending: 'SKIP' };

/** The per-spec lines, the per-group table and the ratchet's findings, ready to print. */
export function formatResults(
  parsed: ParsedReport,
  verdict: Verdict,
  notApplicable: NotApplicable[],
  offline: NotApplicable[] = [],
  ratchetDir = 'test/conformance',
  expectedFile = `${ratchetDir}/expected.txt`,
): string[] {
  const lines: string[] = [];
  const na = new Set(notApplicable.map((n) => n.name));
  const limited = new Set(offline.map((n) => n.name));
  for (const p of parsed.suiteProblems) lines.push(`SUITE ${p.node} ${p.state}: ${p.message ?? ''}`);
  for (const s of [...parsed.specs].sort((a, b) => a.name.localeCompare(b.name))) {
    if (s.filtered) continue;
    const mark = MARK[s.state] ?? s.state.toUpperCase();
    const tag = na.has(s.name) ? ' [not applicable]' : limited.has(s.name) ? ' [offline limit]' : '';
    lines.push(`${mark.padEnd(4)} ${s.name}${tag} (${(s.runTimeMs / 1000).toFixed(1)} s)`);
    if (s.state !== 'passed' && s.message !== null) lines.push(`       ${s.message.slice(0, 400)}${s.location ? ` [${s.location}]` : ''}`);
  }
  lines.push('', 'per group (passed / failed / skipped):');
  for (const g of countByGroup(parsed.specs)) lines.push(`  ${g.group.padEnd(44)} ${g.passed} / ${g.failed} / ${g.skipped}`);
  const section = (title: string, names: string[]) => {
    if (names.length === 0) return;
    lines.push('', title);
    for (const n of names) lines.push(`  ${n}`);
  };
  section(
    `RATCHET: must-pass specs that did not pass (${expectedFile}):`,
    verdict.regressions.map((s) => s.name),
  );
  section(`RATCHET: names in ${ratchetDir}/*.txt that critest does not have:`, verdict.unknownNames);
  section('RATCHET: names listed both as must-pass and as not applicable or offline-limited:', verdict.contradictions);
  section(
    `newly passing: add these lines to ${expectedFile} in this commit (or run with CONFORMANCE_UPDATE=1):`,
    verdict.newlyPassing.map((s) => s.name),
  );
  section(
    `not applicable, but not refused with INVALID_ARGUMENT (see ${ratchetDir}/not-applicable.txt):`,
    verdict.notRefused.map((s) => `${s.name}\n      -> ${(s.message ?? s.state).slice(0, 200)}`),
  );
  if (verdict.notRun.length > 0) lines.push('', `${verdict.notRun.length} must-pass specs were filtered out of this run and not checked.`);
  return lines;
}

/** expected.txt with the newly passing specs added, sorted, comments at the top kept. */
export function updatedExpected(text: string, add: string[]): string {
  const header = text.split('\n').filter((l) => l.startsWith('#'));
  const names = [...new Set([...parseExpected(text), ...add])].sort();
  return `${[...header, ...names].join('\n')}\n`;
}

/**
 * Specs the runc reference passes (containerd + runc on this machine kind) that ran through the
 * kata-ts handler and did not pass, apart from those `notApplicable` exempts with a reason.
 */
export function referenceFailures(specs: SpecResult[], reference: string[], notApplicable: NotApplicable[]): SpecResult[] {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const exempt = new Set(notApplicable.map((n) => n.name));
  return reference
    .filter((n) => !exempt.has(n))
    .map((n) => byName.get(n))
    .filter((s): s is SpecResult => s !== undefined && !s.filtered && s.state !== 'passed');
}

/** The lines saying which reference specs the kata-ts handler failed (none when it failed none). */
export function referenceGap(
  specs: SpecResult[],
  reference: string[],
  notApplicable: NotApplicable[],
  referenceFile = 'test/conformance/containerd/runc-reference.txt',
): string[] {
  const failed = referenceFailures(specs, reference, notApplicable);
  if (failed.length === 0) return [];
  return ['', `passed by containerd + runc (${referenceFile}), failed with the kata-ts handler:`, ...failed.map((s) => `  ${s.name}`)];
}

/**
 * The pass counts of one release compared, over the reference specs this run ran (a focused run
 * compares only what it ran): the kata-ts handler must pass at least as many as runc did, minus
 * those not-applicable.txt exempts. One line, `holds` or `FAILS`, with the three counts.
 */
export function referenceComparison(specs: SpecResult[], reference: string[], notApplicable: NotApplicable[]): string {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const exempt = new Set(notApplicable.map((n) => n.name));
  const ran = reference.map((n) => byName.get(n)).filter((s): s is SpecResult => s !== undefined && !s.filtered);
  const exemptRan = ran.filter((s) => exempt.has(s.name)).length;
  const passed = ran.filter((s) => s.state === 'passed').length;
  const needed = ran.length - exemptRan;
  const verdict = passed >= needed && referenceFailures(specs, reference, notApplicable).length === 0 ? 'holds' : 'FAILS';
  return `runc comparison ${verdict}: kata-ts passed ${passed} of the ${ran.length} runc-reference specs run; needed ${needed} (${ran.length} minus ${exemptRan} not applicable to a VM)`;
}
