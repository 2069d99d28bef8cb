import { invalid, precondition } from '../common/errors.js';
import './reasons.js';

/** A containerd release, as `containerd --version` names it. */
export interface ContainerdVersion {
  major: number;
  minor: number;
  patch: number;
}

/** The config schema a containerd release reads: `version = 2` (1.x's CRI plugin) or `version = 3` (2.x). */
export type ConfigSchema = 2 | 3;

/**
 * The version in `containerd --version`'s output: `containerd <package> <version> <revision>`,
 * e.g. `containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3` (Debian) or
 * `containerd containerd.io v1.7.27 05044ec...`; also a bare `1.7.27` or `v2.1.0` (the override).
 */
export function parseContainerdVersion(text: string): ContainerdVersion {
  const words = text.trim().split(/\s+/);
  const candidates = words[0] === 'containerd' ? words.slice(2) : words;
  for (const word of candidates) {
    const m = /^v?(\d{1,4})\.(\d{1,4})\.(\d{1,6})(?:[-~+.].*)?$/.exec(word);
    if (m !== null) return { major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3]) };
  }
  throw invalid('CONTAINERD_VERSION_UNPARSABLE', `no containerd version (major.minor.patch) in "${text.trim().slice(0, 120)}"`);
}

export function formatVersion(v: ContainerdVersion): string {
  return `${v.major}.${v.minor}.${v.patch}`;
}

/** 1.6 and 1.7 (config version 2, CRI plugin `io.containerd.grpc.v1.cri`) and 2.x (version 3). */
export function supportedSchemas(v: ContainerdVersion): readonly ConfigSchema[] | null {
  if (v.major === 1 && (v.minor === 6 || v.minor === 7)) return [2];
  // containerd 2.x reads version 3 and migrates a version 2 file when it loads it.
  if (v.major === 2) return [3, 2];
  return null;
}

/** The schemas the release reads, or FAILED_PRECONDITION naming the release. */
export function requireSupported(v: ContainerdVersion): readonly ConfigSchema[] {
  const schemas = supportedSchemas(v);
  if (schemas === null) {
    throw precondition(
      'CONTAINERD_VERSION_UNSUPPORTED',
      `containerd ${formatVersion(v)} is not supported: kata-ts's shim and installer support containerd 1.6, 1.7 and 2.x`,
      { details: { containerdVersion: formatVersion(v) } },
    );
  }
  return schemas;
}
