/**
 * Now in nanoseconds since the epoch, at the clock's millisecond precision: the unit the CRI, the
 * records and the logs carry timestamps in (as a decimal string on the wire, a bigint in between).
 */
export function epochNs(): bigint {
  return BigInt(Date.now()) * 1_000_000n;
}
