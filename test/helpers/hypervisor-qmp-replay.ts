/**
 * Replays a recorded QMP transcript (fixtures/qmp/*.qmp, see hypervisor-qmp-record.ts) as the
 * QEMU side of an in-memory Duplex pair: every line the client sends must equal (as JSON) the next
 * recorded `->` line; the `<-` lines that follow it are then delivered, cut into chunks in one of
 * several ways so that line framing is exercised (whole lines, single bytes, everything merged).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Duplex } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';

export type TranscriptEntry = { dir: 'send'; line: string } | { dir: 'recv'; line: string } | { dir: 'close' };

export type Chunking = 'lines' | 'bytes' | 'merged' | 'odd';

const fixtureDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../fixtures/qmp');

export function loadTranscript(name: string): TranscriptEntry[] {
  return parseTranscript(readFileSync(path.join(fixtureDir, `${name}.qmp`), 'utf8'));
}

export function parseTranscript(text: string): TranscriptEntry[] {
  const entries: TranscriptEntry[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line === '' || line.startsWith('#')) continue;
    if (line === '<- CLOSE') entries.push({ dir: 'close' });
    else if (line.startsWith('<- ')) entries.push({ dir: 'recv', line: line.slice(3) });
    else if (line.startsWith('-> ')) entries.push({ dir: 'send', line: line.slice(3) });
    else throw new Error(`transcript line not understood: ${line}`);
  }
  return entries;
}

/** Two connected Duplex ends: what one writes, the other reads. */
export function duplexPair(): [Duplex, Duplex] {
  const ends: Duplex[] = [];
  const make = (other: () => Duplex): Duplex =>
    new Duplex({
      read() {},
      write(chunk: Buffer, _enc, cb) {
        other().push(chunk);
        cb();
      },
      final(cb) {
        other().push(null);
        cb();
      },
    });
  ends.push(
    make(() => ends[1]!),
    make(() => ends[0]!),
  );
  return [ends[0]!, ends[1]!];
}

export interface ReplayOptions {
  chunking?: Chunking;
}

/** The QEMU end of a replayed conversation; hand `client` to the code under test. */
export class TranscriptReplay {
  readonly client: Duplex;
  private readonly server: Duplex;
  private position = 0;
  private inbox = '';
  /** Mismatches between what the client sent and what the transcript expected. */
  readonly mismatches: string[] = [];
  /** Every line the client sent. */
  readonly sent: string[] = [];

  constructor(
    private readonly entries: TranscriptEntry[],
    private readonly options: ReplayOptions = {},
  ) {
    [this.client, this.server] = duplexPair();
    this.server.on('data', (chunk: Buffer) => this.onClientData(chunk.toString('utf8')));
    this.deliverUntilNextSend();
  }

  /** True when every recorded line has been exchanged. */
  get finished(): boolean {
    return this.position >= this.entries.length;
  }

  /** Simulate QEMU going away now. */
  closeNow(): void {
    this.server.end();
  }

  private onClientData(text: string): void {
    this.inbox += text;
    let nl = this.inbox.indexOf('\n');
    while (nl >= 0) {
      const line = this.inbox.slice(0, nl);
      this.inbox = this.inbox.slice(nl + 1);
      this.sent.push(line);
      const expected = this.entries[this.position];
      if (expected?.dir !== 'send') {
        this.mismatches.push(`unexpected ${line}`);
      } else if (!isDeepStrictEqual(JSON.parse(line), JSON.parse(expected.line))) {
        this.mismatches.push(`expected ${expected.line}, got ${line}`);
      } else {
        this.position++;
        this.deliverUntilNextSend();
      }
      nl = this.inbox.indexOf('\n');
    }
  }

  private deliverUntilNextSend(): void {
    const lines: string[] = [];
    let close = false;
    while (this.position < this.entries.length) {
      const entry = this.entries[this.position]!;
      if (entry.dir === 'send') break;
      this.position++;
      if (entry.dir === 'close') {
        close = true;
        break;
      }
      lines.push(`${entry.line}\r\n`);
    }
    const chunks = cut(Buffer.from(lines.join(''), 'utf8'), this.options.chunking ?? 'lines', lines);
    // Deliver asynchronously, like a socket would, one chunk per macrotask.
    const push = (i: number): void => {
      if (i < chunks.length) {
        this.server.write(chunks[i]);
        setImmediate(() => push(i + 1));
      } else if (close) {
        this.server.end();
      }
    };
    setImmediate(() => push(0));
  }
}

function cut(data: Buffer, chunking: Chunking, lines: string[]): Buffer[] {
  if (data.length === 0) return [];
  switch (chunking) {
    case 'merged':
      return [data];
    case 'lines':
      return lines.map((l) => Buffer.from(l, 'utf8'));
    case 'bytes':
      return [...data].map((b) => Buffer.from([b]));
    case 'odd': {
      // Pieces of 1..13 bytes, cutting through JSON tokens, CRLFs and multi-byte characters.
      const out: Buffer[] = [];
      let offset = 0;
      let size = 1;
      while (offset < data.length) {
        out.push(data.subarray(offset, offset + size));
        offset += size;
        size = ((size * 7 + 3) % 13) + 1;
      }
      return out;
    }
  }
}
