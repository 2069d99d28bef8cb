import { StringDecoder } from 'node:string_decoder';

/**
 * Turns stream chunks into lines: a chunk may carry half a line, several lines, or cut a UTF-8
 * character in two. CR before LF is dropped (QEMU ends QMP messages with CRLF).
 */
export class LineSplitter {
  private readonly decoder = new StringDecoder('utf8');
  private buffer = '';

  constructor(private readonly onLine: (line: string) => void) {}

  push(chunk: Buffer | string): void {
    this.buffer += typeof chunk === 'string' ? chunk : this.decoder.write(chunk);
    let newline = this.buffer.indexOf('\n');
    while (newline >= 0) {
      const line = this.buffer.slice(0, newline).replace(/\r$/, '');
      this.buffer = this.buffer.slice(newline + 1);
      this.onLine(line);
      newline = this.buffer.indexOf('\n');
    }
  }
}
