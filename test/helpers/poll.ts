import { promises as fsp } from 'node:fs';

/** Polls `fn` every `intervalMs` until it answers something other than undefined; throws after `timeoutMs`. */
export async function until<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000, intervalMs = 100): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** CRI log file -> "stream tag text" lines (the timestamp dropped); a missing file has none. */
export async function criLogLines(file: string): Promise<string[]> {
  const text = await fsp.readFile(file, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split(' ').slice(1).join(' '));
}
