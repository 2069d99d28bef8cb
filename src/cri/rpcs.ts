/**
 * The rpc handler maps, typed from the service definitions proto-loader-gen-types generates
 * (src/generated, `npm run gen`): one handler per unary rpc of the service, keyed by its exact
 * name, taking the decoded request and answering the response type. A missing or misspelled rpc
 * does not compile; rpcs kata-ts does not offer yet are listed with `notImplementedYet`.
 * Streaming rpcs are not in the maps: the server answers every one of them UNIMPLEMENTED.
 */
import type { ServerUnaryCall } from '@grpc/grpc-js';
import { unimplemented } from '../common/errors.js';
import type { ContainerEventResponse } from '../generated/runtime/v1/ContainerEventResponse.js';
import type { GetEventsRequest__Output } from '../generated/runtime/v1/GetEventsRequest.js';
import type { ImageServiceHandlers } from '../generated/runtime/v1/ImageService.js';
import type { RuntimeServiceHandlers } from '../generated/runtime/v1/RuntimeService.js';
import type { RequestContext } from '../runtime/context.js';

/** A unary rpc as kata-ts implements it: decoded request and call context in, response out. */
export type RpcHandler<Request, Response> = (request: Request, ctx: RequestContext) => Promise<Response>;

/**
 * The unary rpcs of a generated `<Service>Handlers` interface as RpcHandlers. The interface
 * extends grpc-js's untyped implementation (a string index signature), which is dropped so that
 * only the rpc names the .proto declares remain as keys.
 */
export type UnaryRpcHandlers<Service> = {
  [Name in keyof Service as string extends Name
    ? never
    : Service[Name] extends UnaryCall<infer _Request, infer _Response>
      ? Name
      : never]: Service[Name] extends UnaryCall<infer Request, infer Response> ? RpcHandler<Request, Response> : never;
};

/** The shape of grpc-js's handleUnaryCall, for inference (a streaming handler takes another call). */
type UnaryCall<Request, Response> = (call: ServerUnaryCall<Request, Response>, callback: never) => void;

/** Every unary rpc of `runtime.v1.RuntimeService`. */
export type RuntimeRpcHandlers = UnaryRpcHandlers<RuntimeServiceHandlers>;
/** Every unary rpc of `runtime.v1.ImageService`. */
export type ImageRpcHandlers = UnaryRpcHandlers<ImageServiceHandlers>;
/**
 * A server-streaming rpc as kata-ts implements it: `send` writes one response (false: the client's
 * buffer is full, keep going, grpc-js queues it); the handler resolves when the stream should end
 * and watches `ctx.signal` for the client going away.
 */
export type ServerStreamRpcHandler<Request, Response> = (
  request: Request,
  send: (response: Response) => boolean,
  ctx: RequestContext,
) => Promise<void>;

/** The server-streaming rpcs of `runtime.v1.RuntimeService` kata-ts serves. */
export type RuntimeStreamHandlers = {
  GetContainerEvents: ServerStreamRpcHandler<GetEventsRequest__Output, ContainerEventResponse>;
};

/** A unary rpc name of `runtime.v1.RuntimeService`. */
export type RuntimeRpcName = keyof RuntimeRpcHandlers;

/** The handler of an rpc kata-ts does not offer yet: UNIMPLEMENTED (RPC_UNIMPLEMENTED) with a sentence. */
export function notImplementedYet(method: RuntimeRpcName | keyof ImageRpcHandlers): RpcHandler<unknown, never> {
  return async () => {
    throw unimplemented('RPC_UNIMPLEMENTED', `${method} is not implemented by kata-ts yet`);
  };
}

/**
 * The RuntimeService rpcs kata-ts does not offer yet: the metrics rpcs need per-container
 * accounting inside the VM; CheckpointContainer has no VM-level equivalent yet.
 */
export const RUNTIME_RPCS_NOT_IMPLEMENTED = {
  CheckpointContainer: notImplementedYet('CheckpointContainer'),
  ListMetricDescriptors: notImplementedYet('ListMetricDescriptors'),
  ListPodSandboxMetrics: notImplementedYet('ListPodSandboxMetrics'),
} satisfies Partial<RuntimeRpcHandlers>;
