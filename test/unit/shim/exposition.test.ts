/**
 * Prometheus's text format 0.0.4 as the shim writes it and `kata-ts metrics --shims` reads and
 * merges it: HELP/TYPE lines, escaping, histograms, Go float spellings, and refusals.
 */
import { describe, expect, it } from 'vitest';
import { nodeExposition } from '../../../src/cli/metrics.js';
import {
  ExpositionSyntaxError,
  escapeHelp,
  escapeLabelValue,
  formatExposition,
  formatValue,
  type MetricFamily,
  mergeFamilies,
  parseExposition,
} from '../../../src/shim/exposition.js';

const pod = (id: string): MetricFamily[] => [
  {
    name: 'kata_ts_shim_process_rss_bytes',
    help: 'Resident memory.',
    type: 'gauge',
    samples: [{ suffix: '', labels: { sandbox_id: id, process: 'qemu' }, value: 1024 }],
  },
  {
    name: 'kata_ts_shim_agent_rpc_duration_seconds',
    help: 'Round trip.',
    type: 'histogram',
    samples: [
      { suffix: '_bucket', labels: { sandbox_id: id, le: '0.01' }, value: 1 },
      { suffix: '_bucket', labels: { sandbox_id: id, le: '+Inf' }, value: 2 },
      { suffix: '_sum', labels: { sandbox_id: id }, value: 0.5 },
      { suffix: '_count', labels: { sandbox_id: id }, value: 2 },
    ],
  },
];

describe('formatExposition', () => {
  it('writes HELP and TYPE once per family, then its samples', () => {
    expect(formatExposition(pod('a'))).toBe(
      [
        '# HELP kata_ts_shim_process_rss_bytes Resident memory.',
        '# TYPE kata_ts_shim_process_rss_bytes gauge',
        'kata_ts_shim_process_rss_bytes{sandbox_id="a",process="qemu"} 1024',
        '# HELP kata_ts_shim_agent_rpc_duration_seconds Round trip.',
        '# TYPE kata_ts_shim_agent_rpc_duration_seconds histogram',
        'kata_ts_shim_agent_rpc_duration_seconds_bucket{sandbox_id="a",le="0.01"} 1',
        'kata_ts_shim_agent_rpc_duration_seconds_bucket{sandbox_id="a",le="+Inf"} 2',
        'kata_ts_shim_agent_rpc_duration_seconds_sum{sandbox_id="a"} 0.5',
        'kata_ts_shim_agent_rpc_duration_seconds_count{sandbox_id="a"} 2',
        '',
      ].join('\n'),
    );
    expect(formatExposition([])).toBe('');
    // A family without samples still says what it is (a histogram nobody observed yet).
    expect(formatExposition([{ name: 'x', help: 'h', type: 'counter', samples: [] }])).toBe('# HELP x h\n# TYPE x counter\n');
  });

  it('escapes label values (\\, ", newline) and HELP text (\\, newline); spells values as Go reads them', () => {
    expect(escapeLabelValue('a\\b"c\nd')).toBe('a\\\\b\\"c\\nd');
    expect(escapeHelp('a\\b "c"\nd')).toBe('a\\\\b "c"\\nd');
    expect([Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 0, -1.5, 1e21].map(formatValue)).toEqual([
      'NaN',
      '+Inf',
      '-Inf',
      '0',
      '-1.5',
      '1e+21',
    ]);
    const text = formatExposition([
      { name: 'm', help: 'line one\nline "two" \\', type: 'gauge', samples: [{ suffix: '', labels: { v: 'q"\\\n' }, value: Number.NaN }] },
    ]);
    expect(text).toBe('# HELP m line one\\nline "two" \\\\\n# TYPE m gauge\nm{v="q\\"\\\\\\n"} NaN\n');
    // And it reads back to the same values.
    const [m] = parseExposition(text);
    expect(m?.help).toBe('line one\nline "two" \\');
    expect(m?.samples[0]?.labels).toEqual({ v: 'q"\\\n' });
    expect(m?.samples[0]?.value).toBeNaN();
  });

  it('refuses names, labels and suffixes a scraper would refuse, and a family written twice', () => {
    const bad = (f: Partial<MetricFamily>) => () =>
      formatExposition([{ name: 'ok', help: '', type: 'gauge', samples: [], ...f } as MetricFamily]);
    expect(bad({ name: '1abc' })).toThrow(/metric name/);
    expect(bad({ samples: [{ suffix: '', labels: { 'a-b': 'x' }, value: 1 }] })).toThrow(/label name/);
    expect(bad({ samples: [{ suffix: '', labels: { __name__: 'x' }, value: 1 }] })).toThrow(/label name/);
    expect(bad({ samples: [{ suffix: '_sum', labels: {}, value: 1 }] })).toThrow(/suffix/);
    const twice: MetricFamily = { name: 'a', help: '', type: 'gauge', samples: [] };
    expect(() => formatExposition([twice, twice])).toThrow(/twice/);
  });
});

describe('parseExposition', () => {
  it('reads back what formatExposition wrote, histograms grouped under their family', () => {
    expect(parseExposition(formatExposition(pod('a')))).toEqual(pod('a'));
  });

  it('takes untyped samples, comments and timestamps; refuses broken lines with their number', () => {
    const families = parseExposition('# a comment\nfoo 1 1700000000000\nbar{x="y"} 2\n');
    expect(families.map((f) => [f.name, f.type, f.samples[0]?.value])).toEqual([
      ['foo', 'untyped', 1],
      ['bar', 'untyped', 2],
    ]);
    const lineOf = (text: string) => {
      try {
        parseExposition(text);
      } catch (err) {
        return err instanceof ExpositionSyntaxError ? err.line : -1;
      }
      return 0;
    };
    expect(lineOf('a 1\nb{x="y} 2\n')).toBe(2);
    expect(lineOf('a one\n')).toBe(1);
    expect(lineOf('# TYPE a gauge\na 1\nb 2\na 3\n')).toBe(4);
    expect(lineOf('# TYPE a sometype\n')).toBe(1);
  });
});

describe('merging pods into one node exposition', () => {
  it('puts every pod sample of a family under one HELP/TYPE', () => {
    const text = formatExposition(mergeFamilies([pod('a'), pod('b')]));
    expect(text.match(/# TYPE kata_ts_shim_process_rss_bytes/g)).toHaveLength(1);
    const [rss, rpc] = parseExposition(text);
    expect(rss?.samples.map((s) => s.labels.sandbox_id)).toEqual(['a', 'b']);
    expect(rpc?.samples).toHaveLength(8);
    expect(() => mergeFamilies([pod('a'), [{ ...pod('b')[0]!, type: 'counter' }]])).toThrow(/gauge in one exposition and a counter/);
  });

  it('nodeExposition: skips a pod whose socket failed or whose text is broken, and counts them', () => {
    const { text, problems } = nodeExposition([
      { socket: '/a', text: formatExposition(pod('a')) },
      { socket: '/dead', error: 'connect ECONNREFUSED' },
      { socket: '/bad', text: 'x{ 1\n' },
    ]);
    expect(problems).toEqual(['/dead: connect ECONNREFUSED', expect.stringMatching(/^\/bad: not a valid exposition: line 1/)]);
    const families = parseExposition(text);
    expect(families.find((f) => f.name === 'kata_ts_node_shim_scrapes')?.samples[0]?.value).toBe(3);
    expect(families.find((f) => f.name === 'kata_ts_node_shim_scrape_failures')?.samples[0]?.value).toBe(2);
    expect(families.find((f) => f.name === 'kata_ts_shim_process_rss_bytes')?.samples).toHaveLength(1);
  });
});
