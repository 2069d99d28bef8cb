/**
 * The CRI ImageService messages in the exact shape grpc-js hands to handlers and serialises back
 * with proto-loader options `{ keepCase, longs: String, enums: String, defaults, oneofs }`:
 * snake_case keys, uint64/int64 as decimal strings, unset sub-messages as null.
 *
 * They are declared here (rather than imported from src/generated) so that src/images depends on
 * src/common and src/config only; test/unit/images/cri-shape.test.ts checks at type level that
 * they stay assignable to the generated `__Output` types.
 *
 * Request types accept missing keys, so both a decoded request and a hand-written object fit.
 */

export interface ImageSpecMessage {
  image: string;
  annotations: Record<string, string>;
  user_specified_image: string;
  runtime_handler: string;
  image_ref: string;
}

export type ImageSpecInput = Partial<ImageSpecMessage>;

export interface AuthConfigInput {
  username?: string;
  password?: string;
  /** base64 of `username:password`, as in a docker config.json. */
  auth?: string;
  server_address?: string;
  /** An OAuth2 refresh token exchanged at the registry's token endpoint. */
  identity_token?: string;
  /** A bearer token sent to the registry as is. */
  registry_token?: string;
}

export interface Int64ValueMessage {
  value: string;
}

export interface ImageMessage {
  id: string;
  repo_tags: string[];
  repo_digests: string[];
  /** Bytes, as a decimal string (uint64). */
  size: string;
  uid: Int64ValueMessage | null;
  username: string;
  spec: ImageSpecMessage | null;
  pinned: boolean;
}

export interface PullImageRequestInput {
  image?: ImageSpecInput | null;
  auth?: AuthConfigInput | null;
  /** Ignored: every handler shares one image store. */
  sandbox_config?: unknown;
}

export interface PullImageResponseMessage {
  image_ref: string;
}

export interface ImageStatusRequestInput {
  image?: ImageSpecInput | null;
  verbose?: boolean;
}

export interface ImageStatusResponseMessage {
  image: ImageMessage | null;
  info: Record<string, string>;
}

export interface ListImagesRequestInput {
  filter?: { image?: ImageSpecInput | null } | null;
}

export interface ListImagesResponseMessage {
  images: ImageMessage[];
}

export interface RemoveImageRequestInput {
  image?: ImageSpecInput | null;
}

export type RemoveImageResponseMessage = Record<string, never>;

export interface UInt64ValueMessage {
  value: string;
}

export interface FilesystemUsageMessage {
  /** Nanoseconds since the epoch, decimal string. */
  timestamp: string;
  fs_id: { mountpoint: string } | null;
  used_bytes: UInt64ValueMessage | null;
  inodes_used: UInt64ValueMessage | null;
}

export interface ImageFsInfoResponseMessage {
  image_filesystems: FilesystemUsageMessage[];
  container_filesystems: FilesystemUsageMessage[];
}

/** Per-call controls the CRI server passes down from the gRPC call. */
export interface CallOptions {
  /** Aborted when the client cancels (or its deadline passes). */
  signal?: AbortSignal;
  /**
   * Absolute deadline in epoch milliseconds (what grpc-js `call.getDeadline()` yields as a
   * number); undefined or a non-finite value means none.
   */
  deadlineMs?: number;
}
