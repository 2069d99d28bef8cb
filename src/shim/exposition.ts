/**
 * Prometheus's text exposition format 0.0.4 (pure): families of samples -> text, text -> families
 * (the subset this module writes, which is what `kata-ts metrics --shims` reads back from every
 * pod's shim), and several pods' texts merged into one valid exposition.
 *
 * The format's rules kept here: one `# HELP` and one `# TYPE` line per family, before its samples,
 * and every sample of a family together (a scraper refuses a family seen twice); label values
 * escape `\`, `"` and newline, HELP text escapes `\` and newline; values are Go floats (`NaN`,
 * `+Inf`, `-Inf`); a histogram is `<name>_bucket{le="..."}` (cumulative, ending with `+Inf`),
 * `<name>_sum` and `<name>_count`.
 */

export type MetricType = 'counter' | 'gauge' | 'histogram' | 'untyped';

/** One line of a family: `<family name><suffix>{labels} value`. */
export interface Sample {
  /** '' for counters, gauges and untyped; `_bucket`, `_sum` or `_count` in a histogram. */
  suffix: string;
  labels: Readonly<Record<string, string>>;
  value: number;
}

export interface MetricFamily {
  name: string;
  help: string;
  type: MetricType;
  samples: Sample[];
}

/** The Content-Type of this format. */
export const EXPOSITION_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const HISTOGRAM_SUFFIXES = ['_bucket', '_sum', '_count'];

/** `\` and newline escaped (HELP text). */
export function escapeHelp(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

/** `\`, `"` and newline escaped (a label value). */
export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/** A sample value as Go's ParseFloat reads it. */
export function formatValue(value: number): string {
  if (Number.isNaN(value)) return 'NaN';
  if (value === Number.POSITIVE_INFINITY) return '+Inf';
  if (value === Number.NEGATIVE_INFINITY) return '-Inf';
  return String(value);
}

function formatLabels(labels: Readonly<Record<string, string>>): string {
  const keys = Object.keys(labels);
  if (keys.length === 0) return '';
  return `{${keys.map((k) => `${k}="${escapeLabelValue(labels[k] ?? '')}"`).join(',')}}`;
}

/**
 * Throws (a programming error, not input) when a family's name, a label name or a suffix breaks
 * the format: a scraper would drop the whole exposition.
 */
function checkFamily(f: MetricFamily): void {
  if (!METRIC_NAME.test(f.name)) throw new Error(`metric name "${f.name}" is not valid`);
  for (const s of f.samples) {
    const allowed = f.type === 'histogram' ? HISTOGRAM_SUFFIXES : [''];
    if (!allowed.includes(s.suffix)) throw new Error(`sample suffix "${s.suffix}" does not fit ${f.type} ${f.name}`);
    for (const k of Object.keys(s.labels)) {
      if (!LABEL_NAME.test(k) || k.startsWith('__')) throw new Error(`label name "${k}" of ${f.name} is not valid`);
    }
  }
}

/** The families as exposition text: HELP, TYPE, then the samples, each family once. */
export function formatExposition(families: readonly MetricFamily[]): string {
  const seen = new Set<string>();
  const lines: string[] = [];
  for (const f of families) {
    checkFamily(f);
    if (seen.has(f.name)) throw new Error(`metric family ${f.name} is written twice`);
    seen.add(f.name);
    lines.push(`# HELP ${f.name} ${escapeHelp(f.help)}`, `# TYPE ${f.name} ${f.type}`);
    for (const s of f.samples) lines.push(`${f.name}${s.suffix}${formatLabels(s.labels)} ${formatValue(s.value)}`);
  }
  return lines.length === 0 ? '' : `${lines.join('\n')}\n`;
}

/** Why an exposition text could not be read: the line number (from 1) and what is wrong. */
export class ExpositionSyntaxError extends Error {
  override readonly name = 'ExpositionSyntaxError';
  constructor(
    readonly line: number,
    problem: string,
  ) {
    super(`line ${line}: ${problem}`);
  }
}

function unescapeText(text: string, quotes: boolean): string {
  return text.replace(quotes ? /\\([\\"n])/g : /\\([\\n])/g, (_, c: string) => (c === 'n' ? '\n' : c));
}

function parseValue(text: string, line: number): number {
  if (text === 'NaN') return Number.NaN;
  if (text === '+Inf' || text === 'Inf') return Number.POSITIVE_INFINITY;
  if (text === '-Inf') return Number.NEGATIVE_INFINITY;
  const v = Number(text);
  if (text === '' || Number.isNaN(v)) throw new ExpositionSyntaxError(line, `"${text}" is not a number`);
  return v;
}

/** `{a="x",b="y"}` from `start` (the `{`); returns the labels and the index after `}`. */
function parseLabels(text: string, start: number, line: number): { labels: Record<string, string>; end: number } {
  const labels: Record<string, string> = {};
  let i = start + 1;
  for (;;) {
    while (text[i] === ' ' || text[i] === ',') i++;
    if (text[i] === '}') return { labels, end: i + 1 };
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new ExpositionSyntaxError(line, 'a label has no value');
    const name = text.slice(i, eq).trim();
    if (!LABEL_NAME.test(name)) throw new ExpositionSyntaxError(line, `label name "${name}" is not valid`);
    if (text[eq + 1] !== '"') throw new ExpositionSyntaxError(line, `label ${name}'s value is not quoted`);
    let j = eq + 2;
    let raw = '';
    for (; j < text.length && text[j] !== '"'; j++) {
      if (text[j] === '\\') {
        raw += text.slice(j, j + 2);
        j++;
      } else raw += text[j];
    }
    if (j >= text.length) throw new ExpositionSyntaxError(line, `label ${name}'s value is not closed`);
    if (Object.hasOwn(labels, name)) throw new ExpositionSyntaxError(line, `label ${name} is given twice`);
    labels[name] = unescapeText(raw, true);
    i = j + 1;
  }
}

/** The family a sample line belongs to: its own name, or a histogram's whose suffix it carries. */
function familyOf(name: string, families: Map<string, MetricFamily>): { family: MetricFamily | undefined; suffix: string } {
  const own = families.get(name);
  if (own !== undefined) return { family: own, suffix: '' };
  for (const suffix of HISTOGRAM_SUFFIXES) {
    if (!name.endsWith(suffix)) continue;
    const base = families.get(name.slice(0, -suffix.length));
    if (base?.type === 'histogram') return { family: base, suffix };
  }
  return { family: undefined, suffix: '' };
}

/**
 * Read exposition text into families. Samples without a TYPE line become untyped families of
 * their own; a family whose samples are split by another family's is an error, as for Prometheus.
 */
export function parseExposition(text: string): MetricFamily[] {
  const families = new Map<string, MetricFamily>();
  const closed = new Set<string>();
  let current: MetricFamily | undefined;
  const open = (name: string, line: number): MetricFamily => {
    let f = families.get(name);
    if (f === undefined) {
      if (!METRIC_NAME.test(name)) throw new ExpositionSyntaxError(line, `metric name "${name}" is not valid`);
      f = { name, help: '', type: 'untyped', samples: [] };
      families.set(name, f);
    } else if (closed.has(name) || (current !== f && f.samples.length > 0)) {
      throw new ExpositionSyntaxError(line, `family ${name} appears twice`);
    }
    if (current !== undefined && current !== f) closed.add(current.name);
    current = f;
    return f;
  };
  const lines = text.split('\n');
  for (let n = 0; n < lines.length; n++) {
    const line = n + 1;
    const raw = lines[n]!.trim();
    if (raw === '') continue;
    if (raw.startsWith('#')) {
      const m = /^#\s*(HELP|TYPE)\s+(\S+)(?:\s(.*))?$/.exec(raw);
      if (m === null) continue; // a comment
      const f = open(m[2]!, line);
      const rest = m[3] ?? '';
      if (m[1] === 'HELP') f.help = unescapeText(rest, false);
      else {
        if (!['counter', 'gauge', 'histogram', 'untyped', 'summary'].includes(rest.trim())) {
          throw new ExpositionSyntaxError(line, `type "${rest}" is not known`);
        }
        if (f.samples.length > 0) throw new ExpositionSyntaxError(line, `TYPE of ${f.name} comes after its samples`);
        // Summaries are read as untyped: nothing here writes them.
        f.type = rest.trim() === 'summary' ? 'untyped' : (rest.trim() as MetricType);
      }
      continue;
    }
    const nameEnd = raw.search(/[{\s]/);
    if (nameEnd <= 0) throw new ExpositionSyntaxError(line, 'a sample line has no value');
    const name = raw.slice(0, nameEnd);
    let labels: Record<string, string> = {};
    let rest = raw.slice(nameEnd);
    if (rest.startsWith('{')) {
      const parsed = parseLabels(raw, nameEnd, line);
      labels = parsed.labels;
      rest = raw.slice(parsed.end);
    }
    const [valueText = '', timestamp] = rest.trim().split(/\s+/);
    if (timestamp !== undefined && !/^-?\d+$/.test(timestamp))
      throw new ExpositionSyntaxError(line, `timestamp "${timestamp}" is not valid`);
    const found = familyOf(name, families);
    const family = found.family ?? open(name, line);
    if (found.family !== undefined) open(family.name, line);
    family.samples.push({ suffix: found.suffix, labels, value: parseValue(valueText, line) });
  }
  return [...families.values()];
}

/**
 * Several expositions (one per pod) as one: each family once, with the samples of every text
 * that has it, in the order the texts and families first came. The first HELP and TYPE win; a
 * family typed differently by two texts is an error (the texts come from different releases).
 */
export function mergeFamilies(groups: readonly (readonly MetricFamily[])[]): MetricFamily[] {
  const merged = new Map<string, MetricFamily>();
  for (const families of groups) {
    for (const f of families) {
      const into = merged.get(f.name);
      if (into === undefined) merged.set(f.name, { ...f, samples: [...f.samples] });
      else if (into.type !== f.type)
        throw new Error(`metric family ${f.name} is a ${into.type} in one exposition and a ${f.type} in another`);
      else into.samples.push(...f.samples);
    }
  }
  return [...merged.values()];
}
