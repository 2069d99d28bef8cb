import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { criReflectionRoot, PROTO_LOADER_OPTIONS, protoFilePath } from '../common/cri-schema.js';
import type { ProtoGrpcType } from '../generated/api.js';

// The schema helpers live in src/common/cri-schema.ts (the shim decodes CRI messages too).
export { criReflectionRoot, PROTO_LOADER_OPTIONS, protoFilePath };

type CriV1 = ProtoGrpcType['runtime']['v1'];

/** The loaded CRI v1 API: what a grpc-js server registers and a grpc-js client is built from. */
export interface CriPackage {
  /** proto-loader's flat definition, keyed by fully qualified name (`runtime.v1.RunPodSandboxRequest`). */
  readonly packageDefinition: protoLoader.PackageDefinition;
  /** The `runtime.v1` namespace: client constructors and message/enum definitions. */
  readonly v1: CriV1;
  /** Service definition to pass to `grpc.Server.addService` for `runtime.v1.RuntimeService`. */
  readonly runtimeService: CriV1['RuntimeService']['service'];
  /** Service definition to pass to `grpc.Server.addService` for `runtime.v1.ImageService`. */
  readonly imageService: CriV1['ImageService']['service'];
}

let cached: CriPackage | undefined;

/**
 * Load proto/api.proto once (parsing ~170 messages takes tens of milliseconds) and return the
 * grpc-js view of it. Later calls return the same object.
 */
export function loadCriPackage(): CriPackage {
  if (cached !== undefined) return cached;
  const packageDefinition = protoLoader.loadSync(protoFilePath(), PROTO_LOADER_OPTIONS);
  // The generated ProtoGrpcType describes this exact file; grpc-js only knows a generic GrpcObject.
  const grpcObject = grpc.loadPackageDefinition(packageDefinition) as unknown as ProtoGrpcType;
  const v1 = grpcObject.runtime.v1;
  cached = {
    packageDefinition,
    v1,
    runtimeService: v1.RuntimeService.service,
    imageService: v1.ImageService.service,
  };
  return cached;
}
