import { spawn } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import tarStream from 'tar-stream';

/** One entry of a hand-made layer. */
export interface TarEntrySpec {
  name: string;
  type?: 'file' | 'directory' | 'symlink' | 'link' | 'fifo' | 'character-device';
  content?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: Date;
  linkname?: string;
  devmajor?: number;
  devminor?: number;
}

/** A fixed mtime so built layers are byte-for-byte reproducible (and so are their digests). */
export const FIXED_MTIME = new Date('2024-01-02T03:04:05Z');

/** Build an uncompressed tar in memory with tar-stream's packer. */
export async function buildTar(entries: TarEntrySpec[]): Promise<Buffer> {
  const pack = tarStream.pack();
  const chunks: Buffer[] = [];
  const collected = new Promise<Buffer>((resolve, reject) => {
    pack.on('data', (c: unknown) => {
      chunks.push(c as Buffer);
    });
    pack.on('end', () => resolve(Buffer.concat(chunks)));
    pack.on('error', reject);
  });
  for (const e of entries) {
    const type = e.type ?? 'file';
    const header = {
      name: e.name,
      type,
      mode: e.mode ?? (type === 'directory' ? 0o755 : 0o644),
      uid: e.uid ?? 0,
      gid: e.gid ?? 0,
      mtime: e.mtime ?? FIXED_MTIME,
      linkname: e.linkname,
      devmajor: e.devmajor,
      devminor: e.devminor,
    };
    await new Promise<void>((resolve, reject) => {
      const body = type === 'file' ? Buffer.from(e.content ?? '') : undefined;
      if (body !== undefined) pack.entry({ ...header, size: body.length }, body, (err) => (err ? reject(err) : resolve()));
      else pack.entry(header, (err) => (err ? reject(err) : resolve())).end(undefined);
    });
  }
  pack.finalize();
  return collected;
}

export function gzip(data: Buffer): Buffer {
  // mtime 0 in the gzip header (node writes none), so the output is reproducible.
  return gzipSync(data, { level: 6 });
}

/** zstd-compress with the zstd CLI (node 20's zlib cannot); the `zstd` apt package provides it. */
export function zstd(data: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn('zstd', ['-q', '-c', '-3'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(out)) : reject(new Error(`zstd exited ${code}: ${err}`))));
    child.stdin.end(data);
  });
}
