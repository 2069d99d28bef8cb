import { describe, expect, it } from 'vitest';
import { KataError } from '../../../src/common/errors.js';
import {
  compareQuantities,
  parseQuantity,
  quantityEquals,
  quantityTextsEqual,
  quantityToBytes,
  quantityToMillis,
} from '../../../src/sizing/quantity.js';

/** Value of a parsed quantity as a decimal fraction string of nanos, for readable tables. */
function nanos(text: string): bigint {
  return parseQuantity(text, 'q', { allowNegative: true }).nanos;
}

function reasonOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    return (err as KataError).reason;
  }
  throw new Error('expected an error');
}

const N = 1_000_000_000n;

// Cases from k8s.io/apimachinery/pkg/api/resource quantity_test.go (TestQuantityParse), as
// expected values in nanos: unscaled * 10^(exponent + 9).
const KUBERNETES_CASES: Array<[string, bigint]> = [
  ['0', 0n],
  ['0n', 0n],
  ['0u', 0n],
  ['0m', 0n],
  ['0Ki', 0n],
  ['0k', 0n],
  ['0Mi', 0n],
  ['0M', 0n],
  ['0Gi', 0n],
  ['0G', 0n],
  ['0Ti', 0n],
  ['0T', 0n],
  ['1', N],
  ['1Ki', 1024n * N],
  ['8Ki', 8n * 1024n * N],
  ['7Mi', 7n * 1024n ** 2n * N],
  ['6Gi', 6n * 1024n ** 3n * N],
  ['5Ti', 5n * 1024n ** 4n * N],
  ['4Pi', 4n * 1024n ** 5n * N],
  ['3Ei', 3n * 1024n ** 6n * N],
  ['10Ti', 10n * 1024n ** 4n * N],
  ['100Ti', 100n * 1024n ** 4n * N],
  ['5n', 5n],
  ['4u', 4000n],
  ['3m', 3_000_000n],
  ['9', 9n * N],
  ['8k', 8000n * N],
  ['50k', 50_000n * N],
  ['7M', 7_000_000n * N],
  ['6G', 6n * 10n ** 9n * N],
  ['5T', 5n * 10n ** 12n * N],
  ['40T', 40n * 10n ** 12n * N],
  ['300T', 300n * 10n ** 12n * N],
  ['2P', 2n * 10n ** 15n * N],
  ['1E', 10n ** 18n * N],
  ['1E-3', 1_000_000n],
  ['1e3', 1000n * N],
  ['1E6', 10n ** 6n * N],
  ['1e9', 10n ** 9n * N],
  ['1E12', 10n ** 12n * N],
  ['1e15', 10n ** 15n * N],
  ['1E18', 10n ** 18n * N],
  ['1e14', 10n ** 14n * N],
  ['1e13', 10n ** 13n * N],
  ['100.035k', 100_035n * N],
  ['0.001', 1_000_000n],
  ['0.0005k', 500_000_000n],
  ['0.005', 5_000_000n],
  ['0.05', 50_000_000n],
  ['0.5', 500_000_000n],
  ['0.00050k', 500_000_000n],
  ['0.00500', 5_000_000n],
  ['0.05000', 50_000_000n],
  ['0.50000', 500_000_000n],
  ['0.5e0', 500_000_000n],
  ['0.5e-1', 50_000_000n],
  ['0.5e-2', 5_000_000n],
  ['10.035M', 10_035_000n * N],
  ['1.2e3', 1200n * N],
  ['1.3E+6', 1_300_000n * N],
  ['1.40e9', 1_400_000_000n * N],
  ['1.53E12', 1_530_000_000_000n * N],
  ['1.6e15', 1_600_000_000_000_000n * N],
  ['1.7E18', 1_700_000_000_000_000_000n * N],
  ['9.01', 9_010_000_000n],
  ['8.1k', 8100n * N],
  ['7.123456M', 7_123_456n * N],
  ['6.987654321G', 6_987_654_321n * N],
  ['5.444T', 5_444_000_000_000n * N],
  ['40.1T', 40_100_000_000_000n * N],
  ['300.2T', 300_200_000_000_000n * N],
  ['2.5P', 2_500_000_000_000_000n * N],
  ['1.01E', 1_010_000_000_000_000_000n * N],
  // Things that round up to a whole nano.
  ['3.001n', 4n],
  ['1.1E-9', 2n],
  ['0.0000000001', 1n],
  ['0.0000000005', 1n],
  ['0.00000000050', 1n],
  ['0.5e-9', 1n],
  ['0.9n', 1n],
  ['0.00000012345', 124n],
  ['0.00000012354', 124n],
  // Fractional binary.
  ['100.035Ki', 102_435_840_000_000n], // 10243584e-2 units
  ['0.5Mi', 524_288n * N],
  ['0.05Gi', 53_687_091_200_000_000n], // 536870912e-1 units
  ['0.025Ti', 27_487_790_694_400_000_000n], // 274877906944e-1 units
  // "Things written by trolls".
  ['0.000000000001Ki', 2n],
  ['.001', 1_000_000n],
  ['.0001k', 100_000_000n],
  ['1.', N],
  ['1.G', 10n ** 9n * N],
  // Empty mantissas are zero in apimachinery's parser.
  ['.', 0n],
  ['-.', 0n],
  ['+', 0n],
  ['-', 0n],
];

describe('parseQuantity: the cases of apimachinery quantity_test.go', () => {
  it.each(KUBERNETES_CASES)('%s', (text, expected) => {
    expect(nanos(text)).toBe(expected);
    // Every case also parses with an explicit sign, negated or not.
    expect(nanos(`+${text.replace(/^[+-]/, '')}`)).toBe(expected);
    if (!/^[+-]/.test(text)) expect(nanos(`-${text}`)).toBe(-expected);
  });

  // apimachinery's invalid list, plus its exponent-range cases.
  it.each([
    ['1.1.M', 'QUANTITY_MALFORMED'],
    ['1+1.0M', 'QUANTITY_MALFORMED'],
    ['0.1mi', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['0.1am', 'QUANTITY_MALFORMED'],
    ['aoeu', 'QUANTITY_MALFORMED'],
    ['.5i', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['1i', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['-3.01i', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['-3.01e-', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['1e4294967297', 'QUANTITY_EXPONENT_OUT_OF_RANGE'],
    ['1E2147483648', 'QUANTITY_EXPONENT_OUT_OF_RANGE'],
    ['1E-2147483648', 'QUANTITY_EXPONENT_OUT_OF_RANGE'],
    [' 1', 'QUANTITY_MALFORMED'],
    ['1 ', 'QUANTITY_MALFORMED'],
    ['', 'QUANTITY_MALFORMED'],
    ['1K', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['1ki', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['1e', 'QUANTITY_SUFFIX_UNKNOWN'],
    ['1Ki5', 'QUANTITY_SUFFIX_UNKNOWN'],
  ])('refuses %j (%s)', (text, reason) => {
    expect(reasonOf(() => parseQuantity(text, 'spec.containers[0].resources.limits.cpu', { allowNegative: true }))).toBe(reason);
  });

  it('accepts exponents at the int32 bound without building huge numbers', () => {
    expect(nanos('1E-2147483647')).toBe(1n); // rounds up to one nano
    expect(reasonOf(() => nanos('1E2147483647'))).toBe('QUANTITY_OVERFLOW');
    expect(nanos('0E2147483647')).toBe(0n);
  });
});

describe('parseQuantity: refusals with the field named', () => {
  it('names the field and the text in a malformed-value error', () => {
    try {
      parseQuantity('two', 'spec.containers[1].resources.requests.cpu');
      expect.unreachable();
    } catch (err) {
      const e = err as KataError;
      expect(e.kind).toBe('invalid');
      expect(e.reason).toBe('QUANTITY_MALFORMED');
      expect(e.message).toContain('spec.containers[1].resources.requests.cpu');
      expect(e.message).toContain('"two"');
    }
  });

  it('refuses negative amounts unless allowed', () => {
    expect(reasonOf(() => parseQuantity('-1', 'limits.memory'))).toBe('QUANTITY_NEGATIVE');
    expect(parseQuantity('-1', 'x', { allowNegative: true }).nanos).toBe(-N);
    // Negative zero is zero, not negative.
    expect(parseQuantity('-0', 'x').nanos).toBe(0n);
  });

  it('refuses values beyond int64 (apimachinery clamps 9Ei and lets 12E overflow)', () => {
    expect(reasonOf(() => parseQuantity('9Ei', 'x'))).toBe('QUANTITY_OVERFLOW');
    expect(reasonOf(() => parseQuantity('9223372036854775807Ki', 'x'))).toBe('QUANTITY_OVERFLOW');
    expect(reasonOf(() => parseQuantity('12E', 'x'))).toBe('QUANTITY_OVERFLOW');
    expect(reasonOf(() => parseQuantity('9223372036854775808', 'x'))).toBe('QUANTITY_OVERFLOW');
    expect(parseQuantity('9223372036854775807', 'x').nanos).toBe(9223372036854775807n * N);
    expect(parseQuantity('7Ei', 'x').nanos).toBe(7n * 2n ** 60n * N);
  });
});

describe('conversions and equality', () => {
  it('rounds millicores and bytes up like MilliValue() and Value()', () => {
    expect(quantityToMillis(parseQuantity('0.0001', 'x'))).toBe(1n);
    expect(quantityToMillis(parseQuantity('1', 'x'))).toBe(1000n);
    expect(quantityToMillis(parseQuantity('250m', 'x'))).toBe(250n);
    expect(quantityToMillis(parseQuantity('1.5', 'x'))).toBe(1500n);
    expect(quantityToMillis(parseQuantity('100u', 'x'))).toBe(1n);
    expect(quantityToBytes(parseQuantity('1Gi', 'x'))).toBe(1_073_741_824n);
    expect(quantityToBytes(parseQuantity('1.5Ki', 'x'))).toBe(1536n);
    expect(quantityToBytes(parseQuantity('0.1Ki', 'x'))).toBe(103n); // 102.4 rounded up
    expect(quantityToBytes(parseQuantity('1500m', 'x'))).toBe(2n);
    expect(quantityToBytes(parseQuantity('129e6', 'x'))).toBe(129_000_000n);
  });

  it('compares by value, not by spelling', () => {
    const q = (t: string) => parseQuantity(t, 'x');
    expect(quantityEquals(q('1000m'), q('1'))).toBe(true);
    expect(quantityEquals(q('1Gi'), q('1073741824'))).toBe(true);
    expect(quantityEquals(q('1024Mi'), q('1Gi'))).toBe(true);
    expect(quantityEquals(q('1G'), q('1Gi'))).toBe(false);
    expect(quantityEquals(q('1e3'), q('1k'))).toBe(true);
    expect(quantityTextsEqual('0.5', '500m', 'x')).toBe(true);
    // apimachinery TestQuantityCmp
    expect(compareQuantities(q('0'), q('0'))).toBe(0);
    expect(compareQuantities(q('100m'), q('50m'))).toBe(1);
    expect(compareQuantities(q('50m'), q('100m'))).toBe(-1);
    expect(compareQuantities(q('10000T'), q('100Gi'))).toBe(1);
  });
});
