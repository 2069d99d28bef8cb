/**
 * The rpc handler maps are typed from the generated service definitions (src/cri/rpcs.ts):
 * a misspelled or missing rpc does not compile. `tsc -p tsconfig.json` covers test/, so each
 * `@ts-expect-error` below fails the type check the day such a map would compile again.
 */
import { describe, expect, it } from 'vitest';
import { containerHandlers } from '../../../src/cri/container-handlers.js';
import { imageServiceHandlers } from '../../../src/cri/image-handlers.js';
import { loadCriPackage } from '../../../src/cri/proto.js';
import { type ImageRpcHandlers, notImplementedYet, RUNTIME_RPCS_NOT_IMPLEMENTED, type RuntimeRpcHandlers } from '../../../src/cri/rpcs.js';
import { sandboxHandlers } from '../../../src/cri/sandbox-handlers.js';
import { streamingHandlers } from '../../../src/cri/streaming-handlers.js';
import type { RequestContext } from '../../../src/runtime/context.js';

const version = async () => ({ version: '0.1.0', runtime_name: 'kata-ts', runtime_version: '0', runtime_api_version: 'v1' });

describe('rpc handler maps', () => {
  it('a misspelled rpc name does not compile', () => {
    const part = {
      Version: version,
      // @ts-expect-error RunPodSandbx is no rpc of runtime.v1.RuntimeService
      RunPodSandbx: version,
    } satisfies Partial<RuntimeRpcHandlers>;
    expect(Object.keys(part)).toEqual(['Version', 'RunPodSandbx']);
  });

  it('a map missing an rpc does not compile, nor one answering the wrong type or a streaming rpc', () => {
    // @ts-expect-error ImageFsInfo is missing
    const images: ImageRpcHandlers = {
      PullImage: async () => ({ image_ref: 'sha256:00' }),
      ImageStatus: async () => ({}),
      ListImages: async () => ({}),
      RemoveImage: async () => ({}),
    };
    const wrong: Partial<RuntimeRpcHandlers> = {
      // @ts-expect-error Version answers a VersionResponse, whose version is a string
      Version: async () => ({ version: 1 }),
    };
    const streaming = {
      // @ts-expect-error GetContainerEvents streams: the server answers it UNIMPLEMENTED, no unary handler
      GetContainerEvents: version,
    } satisfies Partial<RuntimeRpcHandlers>;
    expect([images, wrong, streaming].map((m) => Object.keys(m).length)).toEqual([4, 1, 1]);
  });

  it('the maps the daemon serves name every unary rpc of the proto, and only those', () => {
    const { runtimeService, imageService } = loadCriPackage();
    const unary = (def: object) =>
      Object.entries(def)
        .filter(([, m]) => !m.requestStream && !m.responseStream)
        .map(([name]) => name)
        .sort();
    const runtime = {
      Version: version,
      Status: version,
      RuntimeConfig: version,
      UpdateRuntimeConfig: version,
      ...sandboxHandlers({} as never, () => [], {} as never),
      ...containerHandlers({} as never, {} as never, {} as never),
      ...streamingHandlers({} as never, {} as never),
      ...RUNTIME_RPCS_NOT_IMPLEMENTED,
    };
    expect(Object.keys(runtime).sort()).toEqual(unary(runtimeService));
    expect(Object.keys(imageServiceHandlers({} as never)).sort()).toEqual(unary(imageService));
  });

  it('an rpc not offered yet answers UNIMPLEMENTED with a sentence naming it', async () => {
    await expect(notImplementedYet('Exec')({}, {} as RequestContext)).rejects.toMatchObject({
      kind: 'unimplemented',
      reason: 'RPC_UNIMPLEMENTED',
      message: 'Exec is not implemented by kata-ts yet',
    });
  });
});
