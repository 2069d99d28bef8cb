import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CriLogFormatter, type FormatChunk, formatChunks, formatRfc3339Nano, NO_PENDING } from '../../../src/runtime/logs/format.js';
import { asKubectlShows, parseCriLog, streamText, withoutTimes } from './cri-log.js';

const T = 1475713029669794202n; // 2016-10-06T00:17:09.669794202Z

function run(chunks: Array<[FormatChunk['stream'], string | Buffer]>, opts: { maxLineBytes?: number; eof?: boolean } = {}) {
  const input = chunks.map(([stream, data]) => ({ stream, data: Buffer.isBuffer(data) ? data : Buffer.from(data), receivedAtNs: T }));
  const { records, pending } = formatChunks(NO_PENDING, input, opts);
  const file = Buffer.concat(records);
  return { file, parsed: parseCriLog(file), pending };
}

describe('formatRfc3339Nano', () => {
  it('prints what Go time.RFC3339Nano prints in UTC, trailing zeros trimmed', () => {
    expect(formatRfc3339Nano(1475713029669794202n)).toBe('2016-10-06T00:17:09.669794202Z');
    expect(formatRfc3339Nano(1475713029669794200n)).toBe('2016-10-06T00:17:09.6697942Z');
    expect(formatRfc3339Nano(1475713029100000000n)).toBe('2016-10-06T00:17:09.1Z');
    expect(formatRfc3339Nano(1475713029000000001n)).toBe('2016-10-06T00:17:09.000000001Z');
    expect(formatRfc3339Nano(1475713029000000000n)).toBe('2016-10-06T00:17:09Z');
    expect(formatRfc3339Nano(0n)).toBe('1970-01-01T00:00:00Z');
  });
});

describe('formatChunks', () => {
  it('writes one F record per full line, with the exact header', () => {
    const { file } = run([['stdout', 'hello\nworld\n']]);
    expect(file.toString()).toBe('2016-10-06T00:17:09.669794202Z stdout F hello\n2016-10-06T00:17:09.669794202Z stdout F world\n');
  });

  it('keeps empty lines; ends lines at \\n or \\r\\n as containerd does, other \\r is content', () => {
    const { parsed } = run([['stderr', '\n\r\nx\r\na\rb\n\r\r\n']]);
    expect(parsed.map((r) => [r.stream, r.tag, r.payload.toString()])).toEqual([
      ['stderr', 'F', ''],
      ['stderr', 'F', ''],
      ['stderr', 'F', 'x'],
      ['stderr', 'F', 'a\rb'],
      ['stderr', 'F', '\r'],
    ]);
    // A "\r" at the end of a chunk waits for the next byte; at eof it is content.
    expect(
      run(
        [
          ['stdout', 'aaaa\r'],
          ['stdout', '\n'],
        ],
        { maxLineBytes: 4 },
      ).parsed.map((r) => `${r.tag}:${r.payload}`),
    ).toEqual(['F:aaaa']);
    expect(
      run(
        [
          ['stdout', 'aaaa\r'],
          ['stdout', 'b\n'],
        ],
        { maxLineBytes: 4 },
      ).parsed.map((r) => `${r.tag}:${r.payload}`),
    ).toEqual(['P:aaaa', 'F:\rb']);
    expect(run([['stdout', 'abc\r']], { eof: true }).parsed.map((r) => `${r.tag}:${r.payload}`)).toEqual(['P:abc\r']);
    expect(run([['stdout', 'abcd\r']], { eof: true, maxLineBytes: 4 }).parsed.map((r) => `${r.tag}:${r.payload}`)).toEqual([
      'P:abcd',
      'P:\r',
    ]);
  });

  it('joins a line split across chunks and carries the unfinished rest', () => {
    const { parsed, pending } = run([
      ['stdout', 'hel'],
      ['stdout', 'lo\nwor'],
    ]);
    expect(parsed.map((r) => r.payload.toString())).toEqual(['hello']);
    expect(Buffer.from(pending.stdout).toString()).toBe('wor');
  });

  it('keeps separate partial lines per stream', () => {
    const { parsed } = run([
      ['stdout', 'out-a'],
      ['stderr', 'err-a'],
      ['stdout', 'out-b\n'],
      ['stderr', 'err-b\n'],
    ]);
    expect(withoutTimes(parsed)).toEqual([
      `stdout F ${Buffer.from('out-aout-b').toString('hex')}`,
      `stderr F ${Buffer.from('err-aerr-b').toString('hex')}`,
    ]);
  });

  it('splits a long line into P records of exactly the maximum, then F with the rest', () => {
    const tags = (s: string) => run([['stdout', s]], { maxLineBytes: 4 }).parsed.map((r) => `${r.tag}:${r.payload.toString()}`);
    expect(tags('abcd\n')).toEqual(['F:abcd']);
    expect(tags('abcde\n')).toEqual(['P:abcd', 'F:e']);
    expect(tags('abcdefgh\n')).toEqual(['P:abcd', 'F:efgh']);
    expect(tags('abcdefghij\n')).toEqual(['P:abcd', 'P:efgh', 'F:ij']);
    // Exactly the maximum pending without a newline waits: the next byte decides P or F.
    expect(tags('abcd')).toEqual([]);
  });

  it('uses 16 KiB lines by default', () => {
    const { parsed } = run([['stdout', `${'x'.repeat(16 * 1024 + 1)}\n`]]);
    expect(parsed.map((r) => [r.tag, r.payload.byteLength])).toEqual([
      ['P', 16384],
      ['F', 1],
    ]);
  });

  it('is binary safe', () => {
    const bytes = Buffer.from([0xff, 0x00, 0xfe, 0x20, 0x0a, 0xc3, 0x28]);
    const { parsed, pending } = run([['stdout', bytes]], { eof: true });
    expect(parsed.map((r) => [r.tag, r.payload.toString('hex')])).toEqual([
      ['F', 'ff00fe20'],
      ['P', 'c328'],
    ]);
    expect(pending.stdout.byteLength).toBe(0);
  });

  it('flushes unterminated lines as P records at eof, and nothing for empty ones', () => {
    const { parsed } = run(
      [
        ['stdout', 'no newline'],
        ['stderr', 'done\n'],
      ],
      { eof: true },
    );
    expect(parsed.map((r) => `${r.stream} ${r.tag} ${r.payload.toString()}`)).toEqual(['stderr F done', 'stdout P no newline']);
  });

  it('gives the same records however the byte streams are chunked', () => {
    const write = fc.record({
      stream: fc.constantFrom('stdout' as const, 'stderr' as const),
      data: fc.uint8Array({ maxLength: 40 }).map((a) => Buffer.from(a.map((b) => (b % 5 === 0 ? 0x0a : b)))),
    });
    fc.assert(
      fc.property(
        fc.array(write, { maxLength: 12 }),
        fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 1 }),
        fc.integer({ min: 1, max: 8 }),
        (writes, cuts, max) => {
          const whole = writes.map((w) => ({ ...w, receivedAtNs: T }));
          const pieces: FormatChunk[] = [];
          let k = 0;
          for (const w of writes) {
            for (let i = 0; i < w.data.byteLength; ) {
              const n = cuts[k++ % cuts.length]!;
              pieces.push({ stream: w.stream, data: w.data.subarray(i, i + n), receivedAtNs: T });
              i += n;
            }
          }
          // Feed the pieces one call at a time, carrying the pending lines, as the writer does.
          let pending = NO_PENDING;
          const recs: Buffer[] = [];
          for (const p of pieces) {
            const r = formatChunks(pending, [p], { maxLineBytes: max });
            recs.push(...r.records);
            pending = r.pending;
          }
          recs.push(...formatChunks(pending, [], { maxLineBytes: max, eof: true }).records);
          // And through one long-lived formatter, as the writer uses it.
          const f = new CriLogFormatter(NO_PENDING, max);
          const viaFormatter = parseCriLog(Buffer.concat([...pieces.map((p) => f.push(p)), f.finish(T)]));
          const expected = parseCriLog(Buffer.concat(formatChunks(NO_PENDING, whole, { maxLineBytes: max, eof: true }).records));
          const got = parseCriLog(Buffer.concat(recs));
          expect(withoutTimes(got)).toEqual(withoutTimes(expected));
          expect(withoutTimes(viaFormatter)).toEqual(withoutTimes(expected));
          for (const s of ['stdout', 'stderr'] as const) {
            expect(streamText(got, s)).toEqual(asKubectlShows(Buffer.concat(writes.filter((w) => w.stream === s).map((w) => w.data))));
            for (const r of got) expect(r.payload.byteLength).toBeLessThanOrEqual(max);
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
