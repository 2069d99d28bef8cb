import { type CallOptions, type Client, credentials, Metadata, type ServiceError } from '@grpc/grpc-js';
import { loadCriPackage } from '../../src/cri/proto.js';

// No vitest import here: benches and the systemd harness scenarios use this outside the runner.

/** grpc-js clients for both CRI services on a unix socket, built from proto/ like crictl's. */
export interface CriClients {
  runtime: Client;
  image: Client;
  close(): void;
}

export function criClients(socketPath: string): CriClients {
  const { v1 } = loadCriPackage();
  const target = `unix://${socketPath}`;
  const runtime = new v1.RuntimeService(target, credentials.createInsecure());
  const image = new v1.ImageService(target, credentials.createInsecure());
  return {
    runtime,
    image,
    close: () => {
      runtime.close();
      image.close();
    },
  };
}

/** Call a unary rpc by name and resolve with its (decoded) response. */
export function rpc<T = Record<string, unknown>>(
  client: Client,
  method: string,
  request: object,
  options: CallOptions = { deadline: Date.now() + 120_000 },
): Promise<T> {
  const fn = (client as unknown as Record<string, (...args: unknown[]) => unknown>)[method];
  if (typeof fn !== 'function') throw new Error(`no rpc ${method} on this client`);
  return new Promise<T>((resolve, reject) => {
    fn.call(client, request, new Metadata(), options, (err: ServiceError | null, res: T) => (err ? reject(err) : resolve(res)));
  });
}
