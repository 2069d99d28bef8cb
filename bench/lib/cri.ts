/**
 * CRI clients for benches. test/helpers/cri-client.ts has the same two functions but imports
 * vitest (for expectGrpcError), and vitest refuses to load outside its runner, so benches build
 * their clients here from the same proto/ definition.
 */
import { credentials, Metadata, type CallOptions, type Client, type ServiceError } from '@grpc/grpc-js';
import { loadCriPackage } from '../../src/runtime/cri/proto.js';

export interface CriClients {
  runtime: Client;
  image: Client;
  close(): void;
}

/** grpc-js clients for both CRI services on a unix socket. */
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

/** Call a unary rpc by name and resolve with its decoded response (default deadline 3 minutes). */
export function rpc<T = Record<string, unknown>>(
  client: Client,
  method: string,
  request: object,
  options: CallOptions = { deadline: Date.now() + 180_000 },
): Promise<T> {
  const fn = (client as unknown as Record<string, (...args: unknown[]) => unknown>)[method];
  if (typeof fn !== 'function') throw new Error(`no rpc ${method} on this client`);
  return new Promise<T>((resolve, reject) => {
    fn.call(client, request, new Metadata(), options, (err: ServiceError | null, res: T) => (err ? reject(err) : resolve(res)));
  });
}
