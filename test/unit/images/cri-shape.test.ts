import { describe, expectTypeOf, it } from 'vitest';
import type { Image__Output } from '../../../src/generated/runtime/v1/Image.js';
import type { ImageFsInfoResponse__Output } from '../../../src/generated/runtime/v1/ImageFsInfoResponse.js';
import type { ImageStatusRequest__Output } from '../../../src/generated/runtime/v1/ImageStatusRequest.js';
import type { ImageStatusResponse__Output } from '../../../src/generated/runtime/v1/ImageStatusResponse.js';
import type { ListImagesRequest__Output } from '../../../src/generated/runtime/v1/ListImagesRequest.js';
import type { ListImagesResponse__Output } from '../../../src/generated/runtime/v1/ListImagesResponse.js';
import type { PullImageRequest__Output } from '../../../src/generated/runtime/v1/PullImageRequest.js';
import type { PullImageResponse__Output } from '../../../src/generated/runtime/v1/PullImageResponse.js';
import type { RemoveImageRequest__Output } from '../../../src/generated/runtime/v1/RemoveImageRequest.js';
import type * as Mine from '../../../src/images/cri-types.js';

// Type-level only (checked by `tsc --noEmit`): src/images declares the CRI shapes itself so it
// depends on src/common and src/config alone; these assertions keep them wire-compatible with
// the types generated from proto/api.proto (what grpc-js hands over and serialises back).
describe('src/images CRI shapes match the generated proto-loader types', () => {
  it('accepts decoded requests and returns responses grpc-js can serialise', () => {
    expectTypeOf<PullImageRequest__Output>().toMatchTypeOf<Mine.PullImageRequestInput>();
    expectTypeOf<ImageStatusRequest__Output>().toMatchTypeOf<Mine.ImageStatusRequestInput>();
    expectTypeOf<ListImagesRequest__Output>().toMatchTypeOf<Mine.ListImagesRequestInput>();
    expectTypeOf<RemoveImageRequest__Output>().toMatchTypeOf<Mine.RemoveImageRequestInput>();
    expectTypeOf<Mine.ImageMessage>().toMatchTypeOf<Image__Output>();
    expectTypeOf<Mine.PullImageResponseMessage>().toMatchTypeOf<PullImageResponse__Output>();
    expectTypeOf<Mine.ImageStatusResponseMessage>().toMatchTypeOf<ImageStatusResponse__Output>();
    expectTypeOf<Mine.ListImagesResponseMessage>().toMatchTypeOf<ListImagesResponse__Output>();
    expectTypeOf<Mine.ImageFsInfoResponseMessage>().toMatchTypeOf<ImageFsInfoResponse__Output>();
  });
});
