/**
 * nerdctl for the shim's integration tests (test/integration/shim/nerdctl.test.ts): where the
 * binary comes from, which containerd releases it can drive, and a runner that calls it on a
 * private containerd (test/helpers/containerd.ts) with every root of its own under the test's dir.
 *
 * Where nerdctl comes from, first found wins:
 * 1. `KATA_TS_NERDCTL`: an absolute path to a nerdctl binary (an upstream release, say);
 * 2. Debian's archive: the package `nerdctl` of trixie, then sid, fetched with apt's own client
 *    into the repository's cache (test/helpers/debian-packages.ts; the host's apt state is never
 *    touched). As of this writing neither suite carries one, and the answer says so;
 * 3. `nerdctl` on PATH.
 * Each candidate must run here (`nerdctl --version`: this host's glibc, a binary for this arch).
 *
 * vitest-free, as containerd-releases.ts.
 */
import { execFile } from 'node:child_process';
import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import type { ContainerdReleaseLabel } from './containerd-releases.js';
import { type FetchOptions, fetchDebianPackage } from './debian-packages.js';

const execFileAsync = promisify(execFile);

/** A nerdctl version as `nerdctl --version` prints it (`nerdctl version 2.1.3`). */
export interface NerdctlVersion {
  major: number;
  minor: number;
  patch: number;
}

/** A nerdctl that runs here. */
export interface Nerdctl {
  binary: string;
  version: NerdctlVersion;
  /** `nerdctl --version`'s line. */
  versionText: string;
  /** Where it came from: `KATA_TS_NERDCTL`, `<suite> nerdctl <debian version>`, `PATH`. */
  source: string;
}

/** A nerdctl, or why none can run here (a sentence for the skip notice). */
export type NerdctlResult = { nerdctl: Nerdctl; missing: null } | { nerdctl: null; missing: string };

/** `nerdctl --version`'s output -> its version (pure); null when it is not nerdctl's line. */
export function parseNerdctlVersion(text: string): NerdctlVersion | null {
  const m = /^nerdctl version v?(\d+)\.(\d+)\.(\d+)/m.exec(text.trim());
  if (m === null) return null;
  return { major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3]) };
}

/**
 * The containerd releases (test/helpers/containerd-releases.ts) a nerdctl of `version` supports,
 * newest first (pure): nerdctl 2.x drives containerd 1.7 and 2.x, nerdctl 1.x drives 1.6 and 1.7
 * (their READMEs' support tables).
 */
export function containerdReleasesFor(version: NerdctlVersion): ContainerdReleaseLabel[] {
  return version.major >= 2 ? ['2.1', '1.7'] : ['1.7', '1.6'];
}

async function probe(binary: string, source: string): Promise<NerdctlResult> {
  let stdout: string;
  try {
    ({ stdout } = await execFileAsync(binary, ['--version'], { timeout: 20_000 }));
  } catch (err) {
    return { nerdctl: null, missing: `${source}'s nerdctl (${binary}) does not run here: ${(err as Error).message.split('\n')[0]}` };
  }
  const version = parseNerdctlVersion(stdout);
  if (version === null)
    return { nerdctl: null, missing: `${binary} --version printed ${JSON.stringify(stdout.slice(0, 80))}, not nerdctl's version` };
  return { nerdctl: { binary, version, versionText: stdout.trim(), source }, missing: null };
}

/**
 * A nerdctl that runs here, from the first of the sources above that has one; never throws:
 * what is missing comes back as one sentence naming every source tried.
 */
export async function findNerdctl(fetch: FetchOptions = {}, env: NodeJS.ProcessEnv = process.env): Promise<NerdctlResult> {
  const tried: string[] = [];
  const fromEnv = env.KATA_TS_NERDCTL;
  if (fromEnv !== undefined && fromEnv !== '') {
    if (!path.isAbsolute(fromEnv))
      return { nerdctl: null, missing: `KATA_TS_NERDCTL must be an absolute path, got ${JSON.stringify(fromEnv)}` };
    return probe(fromEnv, 'KATA_TS_NERDCTL');
  }
  for (const suite of ['trixie', 'sid']) {
    try {
      const fetched = await fetchDebianPackage({ suite, package: 'nerdctl' }, fetch);
      const binary = path.join(fetched.root, 'usr', 'bin', 'nerdctl');
      if (!existsSync(binary)) {
        tried.push(`${suite}'s nerdctl ${fetched.version} has no usr/bin/nerdctl`);
        continue;
      }
      const probed = await probe(binary, `${suite} nerdctl ${fetched.version}`);
      if (probed.nerdctl !== null) return probed;
      tried.push(probed.missing);
    } catch (err) {
      tried.push((err as Error).message.split('\n')[0] ?? String(err));
    }
  }
  for (const dir of (env.PATH ?? '').split(':')) {
    if (dir === '' || !path.isAbsolute(dir)) continue;
    const candidate = path.join(dir, 'nerdctl');
    if (!existsSync(candidate)) continue;
    const probed = await probe(candidate, 'PATH');
    if (probed.nerdctl !== null) return probed;
    tried.push(probed.missing);
    break;
  }
  if (tried.length === 2) tried.push('no nerdctl on PATH');
  return { nerdctl: null, missing: `no nerdctl runs here (set KATA_TS_NERDCTL to one): ${tried.join('; ')}` };
}

/** What one nerdctl call gave. */
export interface NerdctlRun {
  code: number;
  stdout: string;
  stderr: string;
}

export interface NerdctlRootsOptions {
  /** The test's own dir: nerdctl's data root, CNI config dir and config file go under it. */
  dir: string;
  /** containerd's socket. */
  address: string;
  /** The containerd namespace. */
  namespace: string;
}

/**
 * nerdctl's global flags with every root of its own under `dir` (pure): its data root (containers'
 * log configs and logs, name store, hosts files), a CNI config dir of its own (nerdctl writes its
 * default bridge's config there when it is missing; never the host's /etc/cni/net.d), the
 * cgroupfs manager (no systemd runs here) and the overlayfs snapshotter.
 */
export function nerdctlGlobalArgs(options: NerdctlRootsOptions): string[] {
  return [
    '--address',
    options.address,
    '--namespace',
    options.namespace,
    '--data-root',
    path.join(options.dir, 'nerdctl', 'data'),
    '--cni-netconfpath',
    path.join(options.dir, 'nerdctl', 'cni', 'net.d'),
    '--cni-path',
    path.join(options.dir, 'nerdctl', 'cni', 'bin'),
    '--cgroup-manager',
    'cgroupfs',
    '--snapshotter',
    'overlayfs',
  ];
}

/**
 * The dirs nerdctlGlobalArgs names, made, and an empty config file for NERDCTL_TOML (so that a
 * host's /etc/nerdctl/nerdctl.toml is never read); answers the environment to run nerdctl with.
 */
export async function prepareNerdctlRoots(dir: string): Promise<Record<string, string>> {
  for (const sub of ['data', 'cni/net.d', 'cni/bin']) await fsp.mkdir(path.join(dir, 'nerdctl', sub), { recursive: true });
  const toml = path.join(dir, 'nerdctl', 'nerdctl.toml');
  await fsp.writeFile(toml, '');
  return { NERDCTL_TOML: toml, PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', HOME: path.join(dir, 'nerdctl') };
}
