import { describe, expect, it } from 'vitest';
import { isKataError } from '../../../src/common/errors.js';
import {
  admissionError,
  admitAnnounced,
  type Difference,
  describeDifferences,
  MAX_DESCRIBED_DIFFERENCES,
  MAX_VALUE_CHARS,
} from '../../../src/runtime/admission/index.js';

/** The `<field> announced <a>, received <r>` clauses of a message, split back apart. */
function clauses(message: string): string[] {
  const colon = message.indexOf(': ');
  return message.slice(colon + 2).split('; ');
}

const diff = (i: number): Difference => ({ field: `mounts["/m${i}"].readonly`, announced: 'true', received: 'false' });

describe('describeDifferences', () => {
  it('names the container and every field with both values, in one sentence', () => {
    const diffs: Difference[] = [
      { field: 'kubernetes_resources.limits.memory', announced: '1Gi', received: '2Gi' },
      { field: 'mounts["/data"].readonly', announced: 'true', received: 'false' },
    ];
    const message = describeDifferences('app', diffs);
    expect(message.startsWith('container "app" differs from what RunPodSandbox announced: ')).toBe(true);
    expect(message).not.toContain('\n');
    expect(clauses(message)).toEqual([
      'kubernetes_resources.limits.memory announced 1Gi, received 2Gi',
      'mounts["/data"].readonly announced true, received false',
    ]);
  });

  it('names the first 20 fields and counts the rest', () => {
    const diffs = Array.from({ length: MAX_DESCRIBED_DIFFERENCES + 5 }, (_, i) => diff(i));
    const parts = clauses(describeDifferences('app', diffs));
    expect(parts).toHaveLength(MAX_DESCRIBED_DIFFERENCES + 1);
    expect(parts.slice(0, MAX_DESCRIBED_DIFFERENCES).map((p) => p.split(' ')[0])).toEqual(
      diffs.slice(0, MAX_DESCRIBED_DIFFERENCES).map((d) => d.field),
    );
    expect(parts.at(-1)).toBe('and 5 more');
  });

  it('names exactly 20 fields without a remainder', () => {
    const parts = clauses(
      describeDifferences(
        'app',
        Array.from({ length: MAX_DESCRIBED_DIFFERENCES }, (_, i) => diff(i)),
      ),
    );
    expect(parts).toHaveLength(MAX_DESCRIBED_DIFFERENCES);
    expect(parts.some((p) => p.startsWith('and '))).toBe(false);
  });

  it('cuts a huge value so that the message stays bounded', () => {
    const huge = `"${'x'.repeat(10_000)}"`;
    const message = describeDifferences('app', [{ field: 'mounts["/a"].host_path', announced: huge, received: '"/b"' }]);
    expect(message.length).toBeLessThan(MAX_VALUE_CHARS + 200);
    expect(message).toContain('…, received "/b"');
  });

  it('bounds a thousand differences', () => {
    const message = describeDifferences(
      'app',
      Array.from({ length: 1000 }, (_, i) => diff(i)),
    );
    expect(message.length).toBeLessThan(MAX_DESCRIBED_DIFFERENCES * (2 * MAX_VALUE_CHARS + 60) + 200);
    expect(message.endsWith('and 980 more')).toBe(true);
  });
});

describe('admissionError', () => {
  it('is a precondition with reason ADMISSION_MISMATCH carrying every difference', () => {
    const result = admitAnnounced(
      { containers: [{ name: 'app', type: 'REGULAR_CONTAINER', kubernetes_resources: { limits: { memory: { string: '1Gi' } } } }] },
      { metadata: { name: 'app' }, kubernetes_resources: { limits: { memory: { string: '2Gi' } } }, CDI_devices: [{ name: 'v.com/x=1' }] },
    );
    expect(result.ok).toBe(false);
    if (result.ok) return;
    const err = admissionError('app', result.differences);
    expect(isKataError(err)).toBe(true);
    expect(err.kind).toBe('precondition');
    expect(err.reason).toBe('ADMISSION_MISMATCH');
    expect(err.details).toEqual({ container: 'app', differences: result.differences });
    expect(clauses(err.message).map((c) => c.split(' ')[0])).toEqual(['kubernetes_resources.limits.memory', 'CDI_devices["v.com/x=1"]']);
  });

  it('keeps all differences in details even past the described ones', () => {
    const diffs = Array.from({ length: 30 }, (_, i) => diff(i));
    const err = admissionError('app', diffs);
    expect((err.details as { differences: Difference[] }).differences).toHaveLength(30);
  });
});
