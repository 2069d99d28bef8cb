/**
 * Ways to reach a TPM: the guest kernel's resource-managed character device (/dev/tpmrm0: one
 * write of a command, one read of its whole response) and swtpm's command channel on a unix
 * socket (`swtpm socket --server type=unixio,path=...` or `type=tcp,port=...`, a byte stream: the
 * response is read until the size in its header has arrived), which the tests use against a real
 * swtpm on the host.
 * File I/O goes through libuv's pool, so a slow TPM (swtpm under TCG) never stalls the agent's loop.
 */
import { open } from 'node:fs/promises';
import net from 'node:net';
import { invalid, unavailable } from '../../src/common/errors.js';
import './reasons.js';
import { TPM_RESPONSE_MAX_BYTES, type TpmTransport } from './tpm.js';

/** The guest's TPM, behind the kernel's resource manager (transient objects are per open file). */
export const GUEST_TPM_DEVICE = '/dev/tpmrm0';

/** A transport over a TPM character device. */
export async function openTpmDevice(path = GUEST_TPM_DEVICE): Promise<TpmTransport> {
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(path, 'r+');
  } catch (err) {
    throw unavailable('TPM_UNAVAILABLE', `cannot open the TPM at ${path}: ${(err as Error).message}`, { cause: err });
  }
  return {
    async send(command) {
      await fh.write(command, 0, command.length, null);
      const buf = Buffer.alloc(TPM_RESPONSE_MAX_BYTES);
      const { bytesRead } = await fh.read(buf, 0, buf.length, null);
      return buf.subarray(0, bytesRead);
    },
    close: () => fh.close(),
  };
}

/**
 * A transport over swtpm's command socket: a unix socket path (`--server type=unixio`) or a
 * loopback TCP port (`type=tcp`, what tpm2-tools' swtpm TCTI also speaks). One command in flight
 * at a time.
 */
export function connectTpmSocket(target: string | { host: string; port: number }, timeoutMs = 30_000): Promise<TpmTransport> {
  const socketPath = typeof target === 'string' ? target : `${target.host}:${target.port}`;
  return new Promise((resolve, reject) => {
    const sock = typeof target === 'string' ? net.createConnection(target) : net.createConnection(target.port, target.host);
    const fail = (err: Error) => reject(unavailable('TPM_UNAVAILABLE', `cannot connect to the TPM at ${socketPath}: ${err.message}`));
    sock.once('error', fail);
    sock.once('connect', () => {
      sock.off('error', fail);
      let pending: { resolve: (b: Buffer) => void; reject: (e: Error) => void; chunks: Buffer[]; timer: NodeJS.Timeout } | null = null;
      const finish = (err: Error | null, value?: Buffer) => {
        const p = pending;
        if (p === null) return;
        pending = null;
        clearTimeout(p.timer);
        if (err !== null) p.reject(err);
        else p.resolve(value as Buffer);
      };
      sock.on('data', (chunk: Buffer) => {
        if (pending === null) return;
        pending.chunks.push(chunk);
        const got = Buffer.concat(pending.chunks);
        if (got.length < 6) return;
        const size = got.readUInt32BE(2);
        if (size < 10 || size > TPM_RESPONSE_MAX_BYTES) {
          finish(invalid('TPM_RESPONSE_MALFORMED', `the TPM at ${socketPath} announced a ${size}-byte response`));
          sock.destroy();
          return;
        }
        if (got.length >= size) finish(null, got.subarray(0, size));
      });
      sock.on('close', () => finish(unavailable('TPM_UNAVAILABLE', `the TPM at ${socketPath} closed the connection`)));
      sock.on('error', (err) => finish(unavailable('TPM_UNAVAILABLE', `the TPM at ${socketPath}: ${err.message}`)));
      resolve({
        send(command) {
          return new Promise<Buffer>((res, rej) => {
            if (pending !== null) return rej(invalid('TPM_REQUEST_INVALID', 'a TPM command is already in flight'));
            const timer = setTimeout(
              () => finish(unavailable('TPM_UNAVAILABLE', `the TPM at ${socketPath} did not answer within ${timeoutMs} ms`)),
              timeoutMs,
            );
            pending = { resolve: res, reject: rej, chunks: [], timer };
            sock.write(command);
          });
        },
        close: () =>
          new Promise<void>((res) => {
            if (sock.destroyed) return res();
            sock.once('close', () => res());
            sock.end();
          }),
      });
    });
  });
}
