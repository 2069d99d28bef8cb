/**
 * The CRI test client: both CRI services on a unix socket, one method per rpc, typed from the
 * service definitions proto-loader-gen-types generates (src/generated, `npm run gen`), so a
 * misspelled rpc, a request field the .proto does not have, or a response field read under the
 * wrong name fails to compile instead of failing (or passing) at run time.
 *
 *   const cri = criClient(socketPath);
 *   const { pod_sandbox_id } = await cri.runtime.RunPodSandbox({ config });
 *
 * No vitest import here: benches and the systemd harness scenarios use this outside the runner.
 */
import {
  type CallOptions,
  type Client,
  type ClientReadableStream,
  credentials,
  Metadata,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceDefinition,
  type ServiceError,
} from '@grpc/grpc-js';
import type { MethodDefinition } from '@grpc/proto-loader';
import { loadCriPackage } from '../../src/cri/proto.js';
import type { ImageServiceDefinition, ImageServiceHandlers } from '../../src/generated/runtime/v1/ImageService.js';
import type { RuntimeServiceDefinition, RuntimeServiceHandlers } from '../../src/generated/runtime/v1/RuntimeService.js';
import { scaledMs } from './time-scale.js';

/**
 * The deadline of a unary call that passes no options: long enough for the slowest rpc on an idle
 * machine (RunPodSandbox boots a TCG guest, PullImage unpacks layers), scaled to this one.
 */
export const DEFAULT_RPC_DEADLINE_MS = 120_000;

/**
 * The rpc names of a generated `<Service>Handlers` interface, split by the handler's shape. The
 * interface extends grpc-js's untyped implementation (a string index signature), which is dropped.
 */
type UnaryNames<Handlers> = keyof {
  [Name in keyof Handlers as string extends Name ? never : Handlers[Name] extends UnaryShape<infer _Q, infer _S> ? Name : never]: true;
};
type ServerStreamNames<Handlers> = keyof {
  [Name in keyof Handlers as string extends Name
    ? never
    : Handlers[Name] extends ServerStreamShape<infer _Q, infer _S>
      ? Name
      : never]: true;
};

/** A unary handler takes a unary call and a callback; a server-streaming one a writable stream. */
type UnaryShape<Request, Response> = (call: ServerUnaryCall<Request, Response>, callback: never) => void;
type ServerStreamShape<Request, Response> = (call: ServerWritableStream<Request, Response>) => void;

/** What a client sends for an rpc (every field optional, as proto3 allows) and what it gets back. */
type RequestOf<Definition> = Definition extends MethodDefinition<infer Request, infer _R, infer _RO, infer _ResponseOut> ? Request : never;
type ResponseOf<Definition> =
  Definition extends MethodDefinition<infer _Request, infer _R, infer _RO, infer ResponseOut> ? ResponseOut : never;

/** One method per unary rpc: the request in, the decoded response out (rejects with the ServiceError). */
export type UnaryMethods<Definition, Names extends keyof Definition> = {
  readonly [Name in Names]: (request: RequestOf<Definition[Name]>, options?: CallOptions) => Promise<ResponseOf<Definition[Name]>>;
};

/**
 * One method per server-streaming rpc: the request in, the stream of decoded responses out. A
 * stream has no deadline unless `options` sets one (an event stream lives as long as the test).
 */
export type ServerStreamMethods<Definition, Names extends keyof Definition> = {
  readonly [Name in Names]: (
    request: RequestOf<Definition[Name]>,
    options?: CallOptions,
  ) => ClientReadableStream<ResponseOf<Definition[Name]>>;
};

type ServiceMethods<Definition, Handlers> = UnaryMethods<Definition, UnaryNames<Handlers> & keyof Definition> &
  ServerStreamMethods<Definition, ServerStreamNames<Handlers> & keyof Definition>;

/** Every rpc of `runtime.v1.RuntimeService`, typed. */
export type RuntimeServiceMethods = ServiceMethods<RuntimeServiceDefinition, RuntimeServiceHandlers>;
/** Every rpc of `runtime.v1.ImageService`, typed. */
export type ImageServiceMethods = ServiceMethods<ImageServiceDefinition, ImageServiceHandlers>;

export interface CriClient {
  runtime: RuntimeServiceMethods;
  image: ImageServiceMethods;
  /**
   * The grpc-js clients underneath, for tests that step outside the .proto on purpose
   * (undecodable bytes, raw method paths).
   */
  grpc: { runtime: Client; image: Client };
  close(): void;
}

/** A typed client for both CRI services on the unix socket at `socketPath`. */
export function criClient(socketPath: string): CriClient {
  const { v1 } = loadCriPackage();
  const target = `unix://${socketPath}`;
  const runtime = new v1.RuntimeService(target, credentials.createInsecure());
  const image = new v1.ImageService(target, credentials.createInsecure());
  return {
    runtime: methodsOf(runtime, v1.RuntimeService.service) as unknown as RuntimeServiceMethods,
    image: methodsOf(image, v1.ImageService.service) as unknown as ImageServiceMethods,
    grpc: { runtime, image },
    close: () => {
      runtime.close();
      image.close();
    },
  };
}

/** The default options of a unary call: a fresh deadline per call. */
function defaultUnaryOptions(): CallOptions {
  return { deadline: Date.now() + scaledMs(DEFAULT_RPC_DEADLINE_MS) };
}

/**
 * Build the methods from the service definition itself (its keys are exactly the rpc names of the
 * .proto), so the object holds what the types above promise and nothing else.
 */
function methodsOf(client: Client, service: ServiceDefinition): Record<string, unknown> {
  const methods: Record<string, unknown> = {};
  for (const [name, def] of Object.entries(service)) {
    if (def.requestStream) continue; // the CRI has no client-streaming rpc
    if (def.responseStream) {
      methods[name] = (request: object, options: CallOptions = {}) =>
        client.makeServerStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, request, new Metadata(), options);
      continue;
    }
    methods[name] = (request: object, options: CallOptions = defaultUnaryOptions()) =>
      new Promise((resolve, reject) => {
        client.makeUnaryRequest(
          def.path,
          def.requestSerialize,
          def.responseDeserialize,
          request,
          new Metadata(),
          options,
          (err: ServiceError | null, res?: object) => (err ? reject(err) : resolve(res)),
        );
      });
  }
  return methods;
}
