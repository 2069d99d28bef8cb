import { describe, expect, it } from 'vitest';
import { type AggregationEntry, aggregatePodAmounts } from '../../../src/sizing/aggregate.js';
import type { SizingContainerType } from '../../../src/sizing/types.js';

const T: Record<string, SizingContainerType> = { I: 'INIT_CONTAINER', S: 'SIDECAR_CONTAINER', R: 'REGULAR_CONTAINER' };

/** "I:5 S:1 R:2" -> entries with a single `cpu` amount each. */
function pod(spec: string): AggregationEntry[] {
  return spec.split(' ').map((part) => {
    const [kind, amount] = part.split(':') as [string, string];
    return { type: T[kind]!, amounts: new Map([['cpu', BigInt(amount)]]) };
  });
}

describe('aggregatePodAmounts: Kubernetes PodRequests with sidecars (KEP-753)', () => {
  it.each([
    ['regular containers add up', 'R:1 R:2 R:3', 6n],
    ['a big one-shot init container dominates', 'I:5 R:1 R:1', 5n],
    ['init containers run one at a time: the largest counts, not the sum', 'I:3 I:4 R:1', 4n],
    ['a sidecar counts in the steady state', 'S:2 R:1', 3n],
    ['a sidecar started before an init container runs beside it', 'S:1 I:5 R:1', 6n],
    ['a sidecar started after an init container does not', 'I:5 S:1 R:1', 5n],
    // KEP-753 worked example: InitUse = [1, 1, 1+1, 1+1], steady = 1+1+1.
    ['sidecars interleaved with init containers', 'I:1 S:1 I:1 S:1 R:1', 3n],
    ['sidecars accumulate before each init container', 'S:1 S:2 I:4 R:0', 7n],
    ['a pod of init containers only needs its largest', 'I:2 I:7 I:1', 7n],
    ['regular containers may come first in the list', 'R:1 S:1 I:3', 4n],
  ])('%s (%s -> %s)', (_name, spec, expected) => {
    expect(aggregatePodAmounts(pod(spec)).get('cpu')).toBe(expected);
  });

  it('aggregates each resource independently and omits what nobody mentions', () => {
    const result = aggregatePodAmounts([
      { type: 'INIT_CONTAINER', amounts: new Map([['memory', 10n]]) },
      {
        type: 'REGULAR_CONTAINER',
        amounts: new Map([
          ['cpu', 2n],
          ['memory', 3n],
        ]),
      },
      { type: 'REGULAR_CONTAINER', amounts: new Map([['nvidia.com/gpu', 1n]]) },
    ]);
    expect(Object.fromEntries(result)).toEqual({ cpu: 2n, memory: 10n, 'nvidia.com/gpu': 1n });
    expect(aggregatePodAmounts([]).size).toBe(0);
  });
});
