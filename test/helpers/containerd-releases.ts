/**
 * The containerd releases the shim's tests run against: Debian 12's own 1.6 (on PATH, installed
 * by scripts/setup.sh), trixie's 1.7 and sid's 2.x. The newer two are fetched by package name
 * with apt's own client into the repository's cache (test/helpers/debian-packages.ts: a private
 * sources list, lists and cache; the host's apt state is never touched) and run from there, each
 * with the `containerd-shim-runc-v2` of its own package. Nothing is installed system-wide.
 *
 * vitest-free, so that benches can use it too.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { type ContainerdVersion, formatVersion, parseContainerdVersion } from '../../src/install/version.js';
import { type FetchOptions, fetchDebianPackage } from './debian-packages.js';

const execFileAsync = promisify(execFile);

/** The releases by their `major.minor` label. */
export type ContainerdReleaseLabel = '1.6' | '1.7' | '2.1';

/** One containerd release the harness can start (test/helpers/containerd.ts `release`). */
export interface ContainerdRelease {
  label: ContainerdReleaseLabel;
  /** What `containerd --version` says, parsed. */
  version: ContainerdVersion;
  /** `containerd --version`'s whole line. */
  versionText: string;
  /** The containerd binary (absolute, or `containerd` for the one on PATH). */
  containerd: string;
  /**
   * The directory holding this release's containerd and containerd-shim-runc-v2, put before the
   * system's on containerd's PATH so that runc pods run this release's shim; null: PATH as it is.
   */
  binDir: string | null;
  /** Where it came from: `Debian 12 (PATH)` or `<suite> containerd <debian version>`. */
  source: string;
}

/** Where each fetched release comes from, and which containerd versions its package must hold. */
const FETCHED: Record<Exclude<ContainerdReleaseLabel, '1.6'>, { suite: string; accepts: (v: ContainerdVersion) => boolean }> = {
  '1.7': { suite: 'trixie', accepts: (v) => v.major === 1 && v.minor === 7 },
  // sid moves: any 2.x it carries is "the 2.x nodes run"; the tests print which one ran.
  '2.1': { suite: 'sid', accepts: (v) => v.major === 2 },
};

/** A release, or why it cannot run here (a sentence for the skip notice). */
export type ContainerdReleaseResult = { release: ContainerdRelease; missing: null } | { release: null; missing: string };

async function versionOf(binary: string): Promise<{ version: ContainerdVersion; versionText: string }> {
  const { stdout } = await execFileAsync(binary, ['--version'], { timeout: 20_000 });
  return { version: parseContainerdVersion(stdout), versionText: stdout.trim() };
}

/**
 * The release `label`: 1.6 is the containerd on PATH (checked to be 1.6), 1.7 and 2.1 are fetched
 * (or found in the cache) and checked to run here (`containerd --version`: this host's glibc and
 * kernel). Never throws: what went wrong comes back as `missing`. `fetch` (the package cache and
 * mirror) is for the helper's own tests; the default is the repository's cache and the host's mirror.
 */
export async function containerdRelease(label: ContainerdReleaseLabel, fetch: FetchOptions = {}): Promise<ContainerdReleaseResult> {
  try {
    if (label === '1.6') {
      const { version, versionText } = await versionOf('containerd');
      if (version.major !== 1 || version.minor !== 6)
        return { release: null, missing: `the containerd on PATH is ${formatVersion(version)}, not 1.6` };
      return {
        release: { label, version, versionText, containerd: 'containerd', binDir: null, source: 'Debian 12 (PATH)' },
        missing: null,
      };
    }
    const { suite, accepts } = FETCHED[label];
    let fetched: Awaited<ReturnType<typeof fetchDebianPackage>>;
    try {
      fetched = await fetchDebianPackage({ suite, package: 'containerd' }, fetch);
    } catch (err) {
      return { release: null, missing: `${suite}'s containerd could not be fetched: ${(err as Error).message.split('\n')[0]}` };
    }
    const binDir = path.join(fetched.root, 'usr', 'bin');
    const containerd = path.join(binDir, 'containerd');
    for (const bin of [containerd, path.join(binDir, 'containerd-shim-runc-v2')]) {
      if (!existsSync(bin)) return { release: null, missing: `${suite}'s containerd ${fetched.version} has no ${path.basename(bin)}` };
    }
    let probed: { version: ContainerdVersion; versionText: string };
    try {
      probed = await versionOf(containerd);
    } catch (err) {
      return {
        release: null,
        missing: `${suite}'s containerd ${fetched.version} does not run here: ${(err as Error).message.split('\n')[0]}`,
      };
    }
    if (!accepts(probed.version)) {
      return { release: null, missing: `${suite}'s containerd is ${formatVersion(probed.version)}, not a ${label} release` };
    }
    return {
      release: { label, ...probed, containerd, binDir, source: `${suite} containerd ${fetched.version}` },
      missing: null,
    };
  } catch (err) {
    return { release: null, missing: `containerd ${label}: ${(err as Error).message.split('\n')[0]}` };
  }
}

/** The CRI config schema a release is given by the harness: version 2 for 1.x, version 3 for 2.x. */
export function configSchemaOf(version: ContainerdVersion): 2 | 3 {
  return version.major >= 2 ? 3 : 2;
}
