/** A promise-chain mutex: callers run one at a time, in arrival order. */
export class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.tail.then(fn, fn);
    this.tail = result.catch(() => undefined);
    return result;
  }
}

/**
 * Reference counts of digests (and rootfs ids) that running pulls are using, so a garbage
 * collection that runs meanwhile (RemoveImage) does not delete what a pull is about to commit.
 */
export class LeaseSet {
  private readonly counts = new Map<string, number>();

  /** Lease `keys`; the returned function releases them (idempotent). */
  acquire(keys: Iterable<string>): () => void {
    const held = [...keys];
    for (const k of held) this.counts.set(k, (this.counts.get(k) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      for (const k of held) {
        const n = (this.counts.get(k) ?? 1) - 1;
        if (n <= 0) this.counts.delete(k);
        else this.counts.set(k, n);
      }
    };
  }

  has(key: string): boolean {
    return this.counts.has(key);
  }
}
