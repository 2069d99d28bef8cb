import type { CallOptions } from '../images/cri-types.js';
import type { ImageService } from '../images/service.js';

/** What a gRPC handler knows about its call (a structural subset of the CRI server's CallContext). */
export interface ImageCallContext {
  signal: AbortSignal;
  deadlineMs: number | undefined;
}

function call(ctx: ImageCallContext): CallOptions {
  return ctx.deadlineMs === undefined ? { signal: ctx.signal } : { signal: ctx.signal, deadlineMs: ctx.deadlineMs };
}

/**
 * The unary rpcs of `runtime.v1.ImageService`, by method name, bound to `service`: ready to pass
 * as the `handlers` of the CRI server's ImageService binding. StreamImages is left to the
 * server's UNIMPLEMENTED answer. The binding checks this map against the generated ImageService
 * (src/cri/rpcs.ts): a missing or misspelled rpc does not compile there.
 */
export function imageServiceHandlers(service: ImageService) {
  return {
    PullImage: (req: Parameters<ImageService['pullImage']>[0], ctx: ImageCallContext) => service.pullImage(req, call(ctx)),
    ImageStatus: (req: Parameters<ImageService['imageStatus']>[0], ctx: ImageCallContext) => service.imageStatus(req, call(ctx)),
    ListImages: (req: Parameters<ImageService['listImages']>[0], ctx: ImageCallContext) => service.listImages(req, call(ctx)),
    RemoveImage: (req: Parameters<ImageService['removeImage']>[0], ctx: ImageCallContext) => service.removeImage(req, call(ctx)),
    ImageFsInfo: (req: unknown, ctx: ImageCallContext) => service.imageFsInfo(req, call(ctx)),
  };
}
