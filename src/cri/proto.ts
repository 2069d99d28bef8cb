import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { packageRoot } from '../common/paths.js';
import type { ProtoGrpcType } from '../generated/api.js';

/**
 * How proto/api.proto is turned into JavaScript objects, everywhere in kata-ts.
 *
 * scripts/gen-proto-types.mjs passes the same flags to proto-loader-gen-types, so the generated
 * declarations in src/generated/ describe exactly the objects these options produce: original
 * snake_case field names, int64 as decimal strings (no precision loss above 2^53), enums by
 * name, unset fields filled with their defaults, and the virtual oneof discriminator fields
 * (which proto3 `optional`, e.g. Quantity.string, relies on).
 */
export const PROTO_LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
} as const satisfies protoLoader.Options;

/** Absolute path of proto/api.proto, valid whether kata-ts runs from src/ (tsx) or dist/. */
export function protoFilePath(): string {
  return path.join(packageRoot(), 'proto', 'api.proto');
}

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

let cachedRoot: protobuf.Root | undefined;

/**
 * protobufjs reflection over proto/api.proto with the original (snake_case) field names: the
 * schema as data (field numbers, types, enums), for validation and for tests that check the file.
 * Loaded once; it describes the same file as {@link loadCriPackage}.
 */
export function criReflectionRoot(): protobuf.Root {
  if (cachedRoot === undefined) {
    const root = new protobuf.Root();
    root.loadSync(protoFilePath(), { keepCase: true });
    root.resolveAll();
    cachedRoot = root;
  }
  return cachedRoot;
}
