import { invalid } from '../common/errors.js';

/**
 * Kubernetes `resource.Quantity`, parsed the way k8s.io/apimachinery does it, in exact integer
 * arithmetic (BigInt; no floating point anywhere).
 *
 * Grammar (apimachinery's parseQuantityString): an optional sign, digits, an optional `.` and
 * digits (either side may be empty: `.5`, `1.`, even `.` and `-` are 0), then a suffix: a decimal SI
 * suffix (n u m "" k M G T P E), a binary SI suffix (Ki Mi Gi Ti Pi Ei), or a decimal exponent
 * `e`/`E` followed by a signed integer whose magnitude fits in int32. No whitespace anywhere.
 *
 * Kubernetes rounds every parsed value UP (away from zero) to a whole number of nano units, so a
 * value is stored exactly as an integer count of 10^-9 units (`nanos`).
 *
 * One deliberate difference: apimachinery silently clamps some values above 2^63-1 (`9Ei`) and
 * lets others through (`12E`), after which Value()/MilliValue() overflow. A pod asking for more
 * than 2^63-1 of anything is a mistake, so here it is refused with QUANTITY_OVERFLOW.
 */
export interface Quantity {
  /** The value in units of 10^-9, rounded up as Kubernetes does at parse time. */
  readonly nanos: bigint;
  /** The text it was parsed from (for messages). */
  readonly text: string;
}

export interface ParseQuantityOptions {
  /** Resource amounts are never negative; allow it only where a signed quantity makes sense. */
  allowNegative?: boolean;
}

const NANOS_PER_UNIT = 1_000_000_000n;
const INT64_MAX = (1n << 63n) - 1n;
const MAX_NANOS = INT64_MAX * NANOS_PER_UNIT;
const INT32_MAX = 2_147_483_647n;
/** Decimal digits of MAX_NANOS (about 9.2e27): anything with more digits overflows for sure. */
const MAX_NANOS_DIGITS = MAX_NANOS.toString().length;

const DECIMAL_SI: ReadonlyMap<string, number> = new Map([
  ['n', -9],
  ['u', -6],
  ['m', -3],
  ['', 0],
  ['k', 3],
  ['M', 6],
  ['G', 9],
  ['T', 12],
  ['P', 15],
  ['E', 18],
]);
const BINARY_SI: ReadonlyMap<string, number> = new Map([
  ['Ki', 10],
  ['Mi', 20],
  ['Gi', 30],
  ['Ti', 40],
  ['Pi', 50],
  ['Ei', 60],
]);

/**
 * sign, integer digits, optional fraction, then the suffix run: apimachinery takes every character
 * of "eEinumkKMGTP", then an optional sign, then digits, and the string must end there.
 */
const SHAPE = /^([+-]?)(\d*)(?:\.(\d*))?([eEinumkKMGTP]*[+-]?\d*)$/;

type Suffix = { base: 10; exponent: number } | { base: 2; exponent: number };

function interpretSuffix(suffix: string): Suffix | 'unknown' | 'exponent_range' {
  const decimal = DECIMAL_SI.get(suffix);
  if (decimal !== undefined) return { base: 10, exponent: decimal };
  const binary = BINARY_SI.get(suffix);
  if (binary !== undefined) return { base: 2, exponent: binary };
  if (suffix.length > 1 && (suffix[0] === 'e' || suffix[0] === 'E')) {
    const rest = suffix.slice(1);
    if (!/^[+-]?\d+$/.test(rest)) return 'unknown';
    const exponent = BigInt(rest);
    // apimachinery keeps the exponent in an int32 scale that it later negates.
    if (exponent > INT32_MAX || exponent < -INT32_MAX) return 'exponent_range';
    return { base: 10, exponent: Number(exponent) };
  }
  return 'unknown';
}

/** ceil(a / b) for a >= 0, b > 0. */
function ceilDivNonNegative(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

/** |value| in nanos, rounded up; `undefined` when it certainly exceeds MAX_NANOS. */
function magnitudeInNanos(mantissa: bigint, fractionDigits: number, suffix: Suffix): bigint | undefined {
  if (mantissa === 0n) return 0n;
  if (suffix.base === 2) {
    // mantissa * 2^e / 10^fractionDigits, in nanos. The binary exponent is at most 60, so the
    // numerator stays small unless the text itself is long.
    const numerator = (mantissa << BigInt(suffix.exponent)) * NANOS_PER_UNIT;
    return ceilDivNonNegative(numerator, 10n ** BigInt(fractionDigits));
  }
  // mantissa * 10^(exponent - fractionDigits + 9) nanos. The exponent may be up to 2^31: decide
  // by digit count before building any power of ten.
  const shift = suffix.exponent - fractionDigits + 9;
  const digits = mantissa.toString().length;
  if (shift >= 0) {
    if (digits + shift > MAX_NANOS_DIGITS) return undefined;
    return mantissa * 10n ** BigInt(shift);
  }
  // Below one nano: Kubernetes rounds any non-zero value up to 1n.
  if (-shift > digits) return 1n;
  return ceilDivNonNegative(mantissa, 10n ** BigInt(-shift));
}

/**
 * Parse a Kubernetes quantity. `field` names where it came from (a JSON/manifest path) and leads
 * every error message. Throws KataError invalid with reason QUANTITY_MALFORMED,
 * QUANTITY_SUFFIX_UNKNOWN, QUANTITY_EXPONENT_OUT_OF_RANGE, QUANTITY_NEGATIVE or QUANTITY_OVERFLOW.
 */
export function parseQuantity(text: string, field: string, options: ParseQuantityOptions = {}): Quantity {
  const match = text === '' ? null : SHAPE.exec(text);
  if (match === null) {
    throw invalid(
      'QUANTITY_MALFORMED',
      `${field} ${JSON.stringify(text)} is not a quantity (expected a number with an optional suffix, e.g. 500m, 2, 1.5Gi, 1e3)`,
      { details: { field, text } },
    );
  }
  const [, sign = '', whole = '', fraction = '', suffixText = ''] = match;
  const suffix = interpretSuffix(suffixText);
  if (suffix === 'unknown') {
    throw invalid(
      'QUANTITY_SUFFIX_UNKNOWN',
      `${field} ${JSON.stringify(text)} has the unknown suffix ${JSON.stringify(suffixText)} (valid: n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or e<exponent>)`,
      { details: { field, text } },
    );
  }
  if (suffix === 'exponent_range') {
    throw invalid('QUANTITY_EXPONENT_OUT_OF_RANGE', `${field} ${JSON.stringify(text)} has an exponent beyond ±2147483647`, {
      details: { field, text },
    });
  }
  const mantissa = BigInt((whole + fraction).replace(/^0+/, '') || '0');
  const magnitude = magnitudeInNanos(mantissa, fraction.length, suffix);
  if (magnitude === undefined || magnitude > MAX_NANOS) {
    throw invalid('QUANTITY_OVERFLOW', `${field} ${JSON.stringify(text)} exceeds the largest quantity, 2^63-1`, {
      details: { field, text },
    });
  }
  const negative = sign === '-' && magnitude !== 0n;
  if (negative && options.allowNegative !== true) {
    throw invalid('QUANTITY_NEGATIVE', `${field} ${JSON.stringify(text)} is negative; a resource amount must be 0 or more`, {
      details: { field, text },
    });
  }
  return { nanos: negative ? -magnitude : magnitude, text };
}

/** ceil(a / b) toward +infinity, for b > 0 (what Kubernetes' ScaledValue does for positive values). */
export function ceilDiv(a: bigint, b: bigint): bigint {
  const q = a / b;
  return a % b > 0n ? q + 1n : q;
}

/** Millicores (or milli-units) rounded up, like Quantity.MilliValue(). */
export function quantityToMillis(q: Quantity): bigint {
  return ceilDiv(q.nanos, 1_000_000n);
}

/** Whole units (bytes for memory) rounded up, like Quantity.Value(). */
export function quantityToBytes(q: Quantity): bigint {
  return ceilDiv(q.nanos, NANOS_PER_UNIT);
}

/** Nanos to whole units rounded up (for aggregated sums kept in nanos). */
export function nanosToUnits(nanos: bigint): bigint {
  return ceilDiv(nanos, NANOS_PER_UNIT);
}

/** Nanos to milli-units rounded up. */
export function nanosToMillis(nanos: bigint): bigint {
  return ceilDiv(nanos, 1_000_000n);
}

/** True when both denote the same amount (`1000m` and `1`, `1Gi` and `1073741824`). */
export function quantityEquals(a: Quantity, b: Quantity): boolean {
  return a.nanos === b.nanos;
}

/** -1, 0 or 1 as a is less than, equal to or greater than b. */
export function compareQuantities(a: Quantity, b: Quantity): -1 | 0 | 1 {
  return a.nanos < b.nanos ? -1 : a.nanos > b.nanos ? 1 : 0;
}

/** Parse both texts and compare by value; for admission, which compares announced and actual. */
export function quantityTextsEqual(a: string, b: string, field: string): boolean {
  return quantityEquals(parseQuantity(a, field, { allowNegative: true }), parseQuantity(b, field, { allowNegative: true }));
}

/**
 * An exact quantity text for an amount in nanos, with the largest decimal suffix (none, m, u, n)
 * that keeps it whole: parseQuantity(formatNanos(x)).nanos === x. (Not Kubernetes' canonical
 * form, which also picks binary suffixes; only used for values kata-ts computes itself.)
 */
export function formatNanos(nanos: bigint): string {
  const sign = nanos < 0n ? '-' : '';
  const magnitude = nanos < 0n ? -nanos : nanos;
  for (const [suffix, scale] of [
    ['', NANOS_PER_UNIT],
    ['m', 1_000_000n],
    ['u', 1000n],
  ] as const) {
    if (magnitude % scale === 0n) return `${sign}${magnitude / scale}${suffix}`;
  }
  return `${sign}${magnitude}n`;
}
