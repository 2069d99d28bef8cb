import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { type LineOverflow, LineSplitter } from '../../../src/hypervisor/line-splitter.js';
import { QMP_GARBAGE_LINES_MAX, QMP_LINE_MAX_BYTES, QmpConnection } from '../../../src/hypervisor/qmp/connection.js';
import { READY_LINE_MAX_BYTES, READY_STRAY_LINES_MAX, ReadyChannel } from '../../../src/hypervisor/ready-channel.js';

function splitter(maxLineBytes: number): { lines: string[]; overflows: LineOverflow[]; s: LineSplitter } {
  const lines: string[] = [];
  const overflows: LineOverflow[] = [];
  const s = new LineSplitter((l) => lines.push(l), { maxLineBytes, onOverflow: (o) => overflows.push(o) });
  return { lines, overflows, s };
}

describe('LineSplitter bound', () => {
  it('splits lines across chunks, keeps a UTF-8 character cut in two, drops CR before LF', () => {
    const { lines, overflows, s } = splitter(64);
    const text = Buffer.from('héllo\r\nwörld\nlast', 'utf8');
    for (const byte of text) s.push(Buffer.from([byte]));
    s.push('\n');
    expect(lines).toEqual(['héllo', 'wörld', 'last']);
    expect(overflows).toEqual([]);
  });

  it('accepts a line of exactly maxLineBytes and holds no more than it', () => {
    const { lines, overflows, s } = splitter(8);
    s.push('1234');
    s.push('5678');
    expect(s.heldBytes).toBe(8);
    s.push('\n');
    expect(lines).toEqual(['12345678']);
    expect(overflows).toEqual([]);
  });

  it('gives up a line without a newline past the bound once, then drops every byte', () => {
    const { lines, overflows, s } = splitter(8);
    s.push('12345');
    s.push('6789');
    expect(overflows).toEqual([{ maxLineBytes: 8, heldBytes: 9 }]);
    expect(s.hasOverflowed).toBe(true);
    expect(s.heldBytes).toBe(0);
    s.push('more\nlines\n');
    expect(lines).toEqual([]);
    expect(overflows).toHaveLength(1);
  });

  it('refuses a finished line that is too long within one chunk, after the good lines before it', () => {
    const { lines, overflows, s } = splitter(4);
    s.push('ok\ntoolong\nnext\n');
    expect(lines).toEqual(['ok']);
    expect(overflows).toEqual([{ maxLineBytes: 4, heldBytes: 7 }]);
  });
});

describe('QmpConnection bounds (a hostile QEMU)', () => {
  it('closes with QMP_PROTOCOL_VIOLATION when a message passes QMP_LINE_MAX_BYTES, holding no more', async () => {
    const stream = new PassThrough();
    const qmp = new QmpConnection(stream);
    const pending = qmp.execute('query-status', undefined, { timeoutMs: 60_000 });
    const chunk = Buffer.alloc(64 * 1024, 'x');
    for (let sent = 0; sent <= QMP_LINE_MAX_BYTES; sent += chunk.length) stream.emit('data', chunk);
    const info = await qmp.closed;
    expect(info.violation?.reason).toBe('QMP_PROTOCOL_VIOLATION');
    await expect(pending).rejects.toMatchObject({ reason: 'QMP_CLOSED' });
    expect(stream.destroyed).toBe(true);
  });

  it('tolerates a few lines that are not JSON, and closes past QMP_GARBAGE_LINES_MAX', async () => {
    const stream = new PassThrough();
    const qmp = new QmpConnection(stream);
    for (let i = 0; i < QMP_GARBAGE_LINES_MAX; i++) stream.emit('data', Buffer.from('garbage\r\n'));
    expect(qmp.isClosed).toBe(false);
    stream.emit('data', Buffer.from('garbage\r\n'));
    expect((await qmp.closed).violation?.message).toContain(`over ${QMP_GARBAGE_LINES_MAX} lines`);
  });
});

describe('ReadyChannel bounds (a hostile guest)', () => {
  let dir: string;
  let server: net.Server;
  let peer: net.Socket | undefined;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'ready-bound-'));
    const socketPath = path.join(dir, 'ready.sock');
    server = net.createServer((s) => {
      peer = s;
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  });
  afterEach(async () => {
    peer?.destroy();
    await new Promise((resolve) => server.close(resolve));
    await fsp.rm(dir, { recursive: true, force: true });
  });

  async function connected(): Promise<{ channel: ReadyChannel; guest: net.Socket }> {
    const channel = await ReadyChannel.connect(path.join(dir, 'ready.sock'), silentLogger());
    for (let i = 0; i < 100 && peer === undefined; i++) await new Promise((r) => setTimeout(r, 10));
    return { channel, guest: peer! };
  }

  it('gives the channel up with READY_CHANNEL_VIOLATION at a line over READY_LINE_MAX_BYTES, after real reports', async () => {
    const { channel, guest } = await connected();
    const violations: string[] = [];
    channel.onViolation((err) => violations.push(err.reason));
    guest.write('KATA_TS_READY vcpus=1 memory_kib=1 online_memory_kib=1\n');
    guest.write(Buffer.alloc(READY_LINE_MAX_BYTES + 1, 'A'));
    await channel.closed;
    expect(channel.ready?.vcpus).toBe(1);
    expect(violations).toEqual(['READY_CHANNEL_VIOLATION']);
    expect(channel.violation?.message).toContain(`over ${READY_LINE_MAX_BYTES} bytes`);
  });

  it('gives the channel up past READY_STRAY_LINES_MAX lines outside the protocol', async () => {
    const { channel, guest } = await connected();
    guest.write('noise\n'.repeat(READY_STRAY_LINES_MAX));
    await new Promise((r) => setTimeout(r, 50));
    expect(channel.violation).toBeUndefined();
    guest.write('noise\n');
    await channel.closed;
    expect(channel.violation?.reason).toBe('READY_CHANNEL_VIOLATION');
    // A listener subscribing late still hears it.
    let heard = '';
    channel.onViolation((err) => (heard = err.reason));
    expect(heard).toBe('READY_CHANNEL_VIOLATION');
  });
});
