/**
 * Reading TPM 2.0 structures (Part 2's marshalling: integers big endian, a TPM2B is a 16-bit size
 * then that many bytes) without ever reading past the end: what is read comes from a TPM, a guest
 * or the network. Shared by the guest's TPM client (guest/agent/tpm.ts, reading responses) and
 * the host's quote verifier (quote.ts, reading evidence); each says through `fail` which coded
 * error a short or overlong structure is, since the guest and the host use different reasons.
 */

/** What went wrong: the structure ended early, or went on after its end. */
export type TpmReadProblem = { kind: 'short'; at: number; need: number; has: number } | { kind: 'trailing'; extra: number };

/** A cursor over `buf` that throws (through `fail`) instead of reading beyond it. */
export class TpmReader {
  private pos = 0;
  constructor(
    private readonly buf: Buffer,
    private readonly fail: (problem: TpmReadProblem) => never,
  ) {}
  /** Bytes read so far. */
  get offset(): number {
    return this.pos;
  }
  /** Bytes not read yet. */
  get left(): number {
    return this.buf.length - this.pos;
  }
  private need(n: number): void {
    if (this.pos + n > this.buf.length) this.fail({ kind: 'short', at: this.pos, need: n, has: this.left });
  }
  u8(): number {
    this.need(1);
    return this.buf.readUInt8(this.pos++);
  }
  u16(): number {
    this.need(2);
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  u32(): number {
    this.need(4);
    const v = this.buf.readUInt32BE(this.pos);
    this.pos += 4;
    return v;
  }
  u64(): bigint {
    this.need(8);
    const v = this.buf.readBigUInt64BE(this.pos);
    this.pos += 8;
    return v;
  }
  /** The next `n` bytes (a view, not a copy). */
  bytes(n: number): Buffer {
    this.need(n);
    const v = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
  /** A TPM2B's content. */
  sized(): Buffer {
    return this.bytes(this.u16());
  }
  /** The bytes read since `start` (an earlier `offset`). */
  since(start: number): Buffer {
    return this.buf.subarray(start, this.pos);
  }
  /** Fails unless everything was read. */
  end(): void {
    if (this.pos !== this.buf.length) this.fail({ kind: 'trailing', extra: this.left });
  }
}
