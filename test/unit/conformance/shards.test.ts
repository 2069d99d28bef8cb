/** critest command lines: user filters, exact-name focus for shards, round-robin split. */
import { describe, expect, it } from 'vitest';
import { focusExactly, ProgressLines, quoteMeta, shard, splitUserArgs } from '../../../scripts/conformance/shards.js';

describe('splitUserArgs', () => {
  it('separates ginkgo focus/skip filters (any spelling) from other critest flags', () => {
    expect(splitUserArgs(['-ginkgo.focus=Image', '--ginkgo.skip', 'benchmark', '-ginkgo.v', '-ginkgo.label-filter=x'])).toEqual({
      filters: ['-ginkgo.focus=Image', '--ginkgo.skip', 'benchmark', '-ginkgo.label-filter=x'],
      rest: ['-ginkgo.v'],
    });
  });
});

describe('focusExactly', () => {
  it("escapes every regexp metacharacter as Go's QuoteMeta does and anchors the end", () => {
    expect(quoteMeta('a.b*c?(d)|[e]{f}^$\\+')).toBe('a\\.b\\*c\\?\\(d\\)\\|\\[e\\]\\{f\\}\\^\\$\\\\\\+');
    const name = '[k8s.io] Image Manager image status get image fields should not have Uid|Username empty [Conformance]';
    const flag = focusExactly(name);
    const re = new RegExp(flag.slice('-ginkgo.focus='.length));
    expect(re.test(`CRI validation ${name}`)).toBe(true);
    expect(re.test(`CRI validation ${name} more`)).toBe(false);
    expect(re.test('CRI validation [k8s.io] Image Manager image status get image fields should not have Uid')).toBe(false);
  });
});

describe('shard', () => {
  it('deals names round-robin and never makes an empty shard', () => {
    expect(shard(['a', 'b', 'c'], 2)).toEqual([['a', 'c'], ['b']]);
    expect(shard(['a'], 4)).toEqual([['a']]);
    expect(shard([], 3)).toEqual([[]]);
  });
});

describe('ProgressLines', () => {
  it("turns critest's -ginkgo.v blocks into one line per finished spec", () => {
    const p = new ProgressLines();
    const out = [
      '------------------------------',
      '[BeforeSuite] ',
      '[BeforeSuite] PASSED [0.000 seconds]',
      '------------------------------',
      '[k8s.io] PodSandbox runtime should support running PodSandbox [Conformance]',
      'sigs.k8s.io/cri-tools/pkg/validate/pod.go:54',
      '  STEP: test run a default PodSandbox @ 11/23/26 22:57:39.9',
      '• [7.044 seconds]',
      '------------------------------',
      '[k8s.io] Container runtime should support starting container [Conformance]',
      '• [FAILED] [6.5 seconds]',
      '------------------------------',
      'SSS',
    ]
      .map((l) => p.feed(l))
      .filter((l) => l !== null);
    expect(out).toEqual([
      'PASS 7.0 s  [k8s.io] PodSandbox runtime should support running PodSandbox [Conformance]',
      'FAIL 6.5 s  [k8s.io] Container runtime should support starting container [Conformance]',
    ]);
  });
});
