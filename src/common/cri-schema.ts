/**
 * The CRI schema (proto/api.proto) as both faces read it: the standalone CRI server loads it for
 * grpc-js (src/cri/proto.ts), and the shim decodes the PodSandboxConfig containerd 2.x's Sandbox
 * API hands it. Here so that neither face imports the other.
 */
import path from 'node:path';
import protobuf from 'protobufjs';
import { packageRoot } from './paths.js';

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
} as const;

/** Absolute path of proto/api.proto, valid whether kata-ts runs from src/ (tsx) or dist/. */
export function protoFilePath(): string {
  return path.join(packageRoot(), 'proto', 'api.proto');
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
