/**
 * The shim's `-info` (containerd 2.x runtime introspection, see docs/shim.md "Runtime info"):
 * containerd runs the shim binary with `-info`, writes the runtime's options on its stdin (a
 * google.protobuf.Any, or nothing) and reads one containerd.types.RuntimeInfo from its stdout.
 * Its `features` is the OCI runtime-spec features document (features.md) as JSON: the CRI plugin
 * offers recursive read-only mounts for a handler whose features name `rro`, and user
 * namespaces for one that names the `user` namespace and id-mapped mounts; the task manager
 * checks a spec's id-mapped mounts against it.
 *
 * Pure: the answer depends on the options read and the package version only (no config, no VM).
 */
import { Buffer } from 'node:buffer';
import { invalid } from '../common/errors.js';
import { packageVersion } from '../common/paths.js';
import { type AnyMessage, decodeMessage, encodeMessage, type MessageInput } from './proto.js';
import './reasons.js';

/** The runtime name RuntimeInfo carries (the runtime type containerd starts this shim for). */
export const RUNTIME_NAME = 'io.containerd.kata-ts.v2';

/**
 * The type url containerd registers for runtime-spec's features.Features (types.containerd.io +
 * opencontainers/runtime-spec + the spec's major version + features/Features): the CRI plugin
 * unpacks `features` only under it.
 */
export const OCI_FEATURES_TYPE_URL = 'types.containerd.io/opencontainers/runtime-spec/1/features/Features';

/** The subset of runtime-spec's features document this shim states (every field is optional in our use). */
export interface OciFeatures {
  ociVersionMin: string;
  ociVersionMax: string;
  hooks: string[];
  mountOptions: string[];
  /**
   * Always present: containerd 2.1's CRI reads `linux.namespaces` through a Go pointer that a
   * document without `linux` leaves nil, and its runtime handler introspection would panic.
   */
  linux: { mountExtensions: { idmap: { enabled: boolean } } };
}

/**
 * What kata-ts can honestly claim:
 * - spec versions: every 1.x config.json containerd writes is read (the decoder, shim/decode/spec.ts,
 *   accepts unknown fields and was checked against the configs of containerd 1.6.20 to 2.1.9,
 *   whose runtime-spec is 1.2.1);
 * - hooks: none are run (a received spec's hooks are accepted and ignored; nothing of the host
 *   may run inside the guest's namespaces), so none are listed;
 * - mount options: only the ones the shim reads from a bind mount (shim/decode/container.ts):
 *   bind/rbind, ro/rw, the propagation modes, and `rro`. Recursive read-only holds end to end:
 *   on the host every mount below the volume's source is bound read-only as well
 *   (runtime/container/shared-dir.ts, `recursive`), and in the guest the whole volume is one
 *   virtio-fs mount with no submounts of its own (virtiofsd announces none), which the guest's
 *   OCI runtime (crun) binds `ro`: nothing below it is writable on either side. The standalone
 *   CRI face (src/cri/runtime-info.ts) states the same. Other options (nosuid, nodev, ...) are
 *   not applied to the guest's bind, so they are not listed;
 * - id-mapped mounts: refused (OCI_MOUNT_IDMAP_UNSUPPORTED; no user namespaces are offered), and
 *   no `user` namespace is listed, so containerd offers no CRI user namespaces either.
 */
export function ociFeatures(): OciFeatures {
  return {
    ociVersionMin: '1.0.0',
    ociVersionMax: '1.2.1',
    hooks: [],
    mountOptions: ['bind', 'rbind', 'ro', 'rw', 'rro', 'private', 'rprivate', 'slave', 'rslave', 'shared', 'rshared'],
    linux: { mountExtensions: { idmap: { enabled: false } } },
  };
}

/**
 * The options containerd wrote on stdin: nothing (no options configured) or one
 * google.protobuf.Any, returned as it came (RuntimeInfo echoes it). kata-ts reads its settings
 * from its own config file, so the Any's content is not interpreted. Throws INVALID_ARGUMENT
 * (SHIM_INFO_OPTIONS_INVALID) for bytes that are not an Any.
 */
export function decodeInfoOptions(stdin: Uint8Array): AnyMessage | null {
  if (stdin.length === 0) return null;
  let any: AnyMessage;
  try {
    any = decodeMessage('google.protobuf.Any', stdin);
  } catch (err) {
    throw invalid('SHIM_INFO_OPTIONS_INVALID', 'the runtime options on stdin are not a google.protobuf.Any.', { cause: err });
  }
  if (any.type_url === '') throw invalid('SHIM_INFO_OPTIONS_INVALID', 'the runtime options on stdin name no type (type_url is empty).');
  return any;
}

/** The RuntimeInfo `-info` prints, for `options` read from stdin (or none). */
export function runtimeInfo(options: AnyMessage | null, version = packageVersion()): MessageInput<'containerd.types.RuntimeInfo'> {
  return {
    name: RUNTIME_NAME,
    version: { version, revision: '' },
    options,
    features: { type_url: OCI_FEATURES_TYPE_URL, value: Buffer.from(JSON.stringify(ociFeatures()), 'utf8') },
    annotations: {},
  };
}

/** `-info`'s whole answer: the protobuf bytes of RuntimeInfo for the stdin bytes containerd wrote. */
export function shimInfo(stdin: Uint8Array, version = packageVersion()): Buffer {
  return encodeMessage('containerd.types.RuntimeInfo', runtimeInfo(decodeInfoOptions(stdin), version));
}
