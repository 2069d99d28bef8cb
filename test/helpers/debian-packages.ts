/**
 * Fetches a Debian package by name from Debian's archive into a cache the tests own, with apt's
 * own client, and extracts it: for parts this machine's Debian 12 does not ship (sid's
 * ovmf-amdsev / ovmf-inteltdx firmware, trixie's or sid's containerd, ...).
 *
 * Nothing of the host's apt state is touched: every suite gets a private sources list, lists,
 * cache and dpkg status under `<cache>/apt/<suite>-<arch>/`, and apt is pointed at them with
 * `-o Dir::...`. The mirror is the one the host's own sources use (so a host behind a local
 * mirror keeps using it), with the requested suite name. Packages are verified by apt against
 * Debian's archive keyring, downloaded with `apt-get download`, and extracted with
 * `dpkg-deb -x`. Everything is cached and idempotent: the lists are refreshed at most once a
 * day, a .deb already downloaded and an extraction already made are reused, and every step
 * writes into a temporary name first and renames it into place, so concurrent test files and an
 * interrupted run leave no half-written entry behind.
 */
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** The repository's own cache for downloaded packages (git-ignored .cache/). */
export const DEFAULT_DEB_CACHE_DIR = resolve(import.meta.dirname, '../../.cache/debs');

/** Debian's archive signing keys (package debian-archive-keyring, present on every Debian host). */
const ARCHIVE_KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg';
const FALLBACK_MIRROR = 'http://deb.debian.org/debian';
/** How old the private lists may get before `apt-get update` runs again. */
const LISTS_MAX_AGE_MS = 24 * 3600 * 1000;

export interface DebianPackageRequest {
  /** A Debian suite or codename: trixie, sid, bookworm-backports, ... */
  suite: string;
  /** The binary package's name. */
  package: string;
  /** dpkg architecture; amd64 unless said (arch-independent packages come out as `all`). */
  arch?: string;
  /** An exact version; the suite's candidate when omitted. */
  version?: string;
  /** Components to list; `main` unless said. */
  components?: string[];
}

export interface FetchedDebianPackage {
  package: string;
  suite: string;
  version: string;
  /** The architecture of the .deb (`all` for arch-independent packages). */
  arch: string;
  debPath: string;
  /** Where the .deb's data is extracted: its files are under here as under `/`. */
  root: string;
  /** The mirror it came from. */
  mirror: string;
}

export interface FetchOptions {
  /** Defaults to DEFAULT_DEB_CACHE_DIR. */
  cacheDir?: string;
  /** Defaults to the mirror of the host's own Debian sources. */
  mirror?: string;
}

/**
 * The Debian mirror URL the host's apt sources use for Debian itself (not -security, not
 * third-party repositories), read from /etc/apt/sources.list and sources.list.d (one-line and
 * deb822 formats); deb.debian.org when none is found.
 */
export function hostDebianMirror(etcApt = '/etc/apt'): string {
  const files: string[] = [];
  if (existsSync(join(etcApt, 'sources.list'))) files.push(join(etcApt, 'sources.list'));
  const partsDir = join(etcApt, 'sources.list.d');
  if (existsSync(partsDir)) {
    for (const name of readdirSync(partsDir).sort()) {
      if (name.endsWith('.list') || name.endsWith('.sources')) files.push(join(partsDir, name));
    }
  }
  const isDebian = (uri: string, suites: string[]) =>
    /\/debian\/?$/.test(uri) && suites.some((s) => !s.endsWith('-security') && /^[a-z]+(-[a-z]+)?$/.test(s));
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    if (file.endsWith('.sources')) {
      for (const stanza of text.split(/\n\s*\n/)) {
        const field = (name: string) => new RegExp(`^${name}:\\s*(.+)$`, 'mi').exec(stanza)?.[1]?.trim().split(/\s+/) ?? [];
        if (!field('Types').includes('deb')) continue;
        const uri = field('URIs').find((u) => isDebian(u, field('Suites')));
        if (uri !== undefined) return uri.replace(/\/$/, '');
      }
    } else {
      for (const line of text.split('\n')) {
        const m = /^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)/.exec(line);
        if (m?.[1] !== undefined && m[2] !== undefined && isDebian(m[1], [m[2]])) return m[1].replace(/\/$/, '');
      }
    }
  }
  return FALLBACK_MIRROR;
}

function checkName(what: string, value: string, pattern: RegExp): void {
  if (!pattern.test(value)) throw new Error(`debian-packages: ${what} "${value}" is not a valid ${what}`);
}

interface AptContext {
  dir: string;
  options: string[];
}

/** Private apt state for one suite and architecture, with lists no older than a day. */
async function aptFor(cacheDir: string, mirror: string, suite: string, arch: string, components: string[]): Promise<AptContext> {
  const dir = join(cacheDir, 'apt', `${suite}-${arch}`);
  for (const sub of ['lists/partial', 'cache/archives/partial', 'preferences.d']) await mkdir(join(dir, sub), { recursive: true });
  const sourcesList = `deb [arch=${arch} signed-by=${ARCHIVE_KEYRING}] ${mirror} ${suite} ${components.join(' ')}\n`;
  const sourcesPath = join(dir, 'sources.list');
  const sourcesChanged = !existsSync(sourcesPath) || readFileSync(sourcesPath, 'utf8') !== sourcesList;
  if (sourcesChanged) await writeFile(sourcesPath, sourcesList);
  if (!existsSync(join(dir, 'status'))) await writeFile(join(dir, 'status'), '');
  const options = [
    '-o',
    `Dir::Etc::sourcelist=${sourcesPath}`,
    '-o',
    'Dir::Etc::sourceparts=-',
    // The host's pinning must not choose our candidates.
    '-o',
    `Dir::Etc::preferences=${join(dir, 'preferences')}`,
    '-o',
    `Dir::Etc::preferencesparts=${join(dir, 'preferences.d')}`,
    '-o',
    `Dir::State=${dir}`,
    '-o',
    `Dir::State::Lists=${join(dir, 'lists')}`,
    '-o',
    `Dir::State::status=${join(dir, 'status')}`,
    '-o',
    `Dir::Cache=${join(dir, 'cache')}`,
    '-o',
    `APT::Architecture=${arch}`,
    // apt would drop to its _apt user, which cannot write into the test's directories, and
    // then warn that it did the download as root anyway; say so up front instead.
    '-o',
    'APT::Sandbox::User=root',
  ];
  const stamp = join(dir, 'updated');
  const fresh = !sourcesChanged && existsSync(stamp) && Date.now() - statSync(stamp).mtimeMs < LISTS_MAX_AGE_MS;
  if (!fresh) {
    await aptUpdate(options);
    await writeFile(stamp, new Date().toISOString());
  }
  return { dir, options };
}

/** How long `apt-get update` waits for another test process that holds the same lists' lock. */
const LIST_LOCK_WAIT_MS = 300_000;

/**
 * `apt-get update` into the private lists. apt locks them and fails at once when another
 * process (a concurrent test file) is updating the same suite, so that case is retried until
 * the other one is done; any other failure is thrown with apt's message.
 */
async function aptUpdate(options: string[]): Promise<void> {
  const started = Date.now();
  for (;;) {
    try {
      await run('apt-get', [...options, '-q', 'update'], { maxBuffer: 16 << 20 });
      return;
    } catch (err) {
      const stderr = String((err as { stderr?: unknown }).stderr ?? '');
      if (!/Could not get lock|Unable to lock/.test(stderr) || Date.now() - started > LIST_LOCK_WAIT_MS) throw err;
      await new Promise((resolveWait) => setTimeout(resolveWait, 1000));
    }
  }
}

/** The version apt would install from the private lists (the suite's candidate). */
async function candidateVersion(apt: AptContext, pkg: string, suite: string): Promise<string> {
  const { stdout } = await run('apt-cache', [...apt.options, 'policy', pkg]);
  const candidate = /Candidate:\s*(\S+)/.exec(stdout)?.[1];
  if (candidate === undefined || candidate === '(none)') throw new Error(`debian-packages: ${suite} has no package ${pkg}`);
  return candidate;
}

/**
 * Fetches (or finds in the cache) `request.package` from `request.suite` and extracts it.
 * Throws, with apt's own message, when the archive cannot be reached or has no such package.
 */
export async function fetchDebianPackage(request: DebianPackageRequest, options: FetchOptions = {}): Promise<FetchedDebianPackage> {
  const arch = request.arch ?? 'amd64';
  const components = request.components ?? ['main'];
  checkName('suite', request.suite, /^[a-z][a-z0-9-]*$/);
  checkName('package', request.package, /^[a-z0-9][a-z0-9+.-]+$/);
  checkName('arch', arch, /^[a-z0-9-]+$/);
  if (request.version !== undefined) checkName('version', request.version, /^[A-Za-z0-9.+~:-]+$/);
  for (const c of components) checkName('component', c, /^[a-z-]+$/);
  const cacheDir = options.cacheDir ?? DEFAULT_DEB_CACHE_DIR;
  const mirror = options.mirror ?? hostDebianMirror();
  const debsDir = join(cacheDir, 'pool', request.suite);
  await mkdir(debsDir, { recursive: true });

  // A pinned version already downloaded needs no network at all.
  const cachedDeb = (version: string) =>
    readdirSync(debsDir).find((name) => name.startsWith(`${request.package}_${version.replace(':', '%3a')}_`) && name.endsWith('.deb'));
  let version = request.version;
  let debName = version === undefined ? undefined : cachedDeb(version);
  if (debName === undefined) {
    const apt = await aptFor(cacheDir, mirror, request.suite, arch, components);
    version ??= await candidateVersion(apt, request.package, request.suite);
    debName = cachedDeb(version);
    if (debName === undefined) {
      const tmp = await mkdtemp(join(debsDir, '.download-'));
      try {
        await run('apt-get', [...apt.options, '-q', 'download', `${request.package}=${version}`], { cwd: tmp, maxBuffer: 16 << 20 });
        const [name, ...more] = (await readdir(tmp)).filter((n) => n.endsWith('.deb'));
        if (name === undefined || more.length > 0)
          throw new Error(`debian-packages: apt-get download of ${request.package} left ${more.length + (name ? 1 : 0)} .deb files`);
        await rename(join(tmp, name), join(debsDir, name));
        debName = name;
      } finally {
        await rm(tmp, { recursive: true, force: true });
      }
    }
  }
  if (version === undefined) throw new Error('debian-packages: no version resolved');
  const debPath = join(debsDir, debName);
  const debArch = /_([^_]+)\.deb$/.exec(debName)?.[1] ?? arch;

  const root = join(cacheDir, 'root', request.suite, debName.replace(/\.deb$/, ''));
  if (!existsSync(root)) {
    const tmp = await mkdtemp(join(cacheDir, '.extract-'));
    try {
      await run('dpkg-deb', ['-x', debPath, tmp]);
      await mkdir(join(cacheDir, 'root', request.suite), { recursive: true });
      // Another process may have won the race: its extraction of the same file is as good.
      await rename(tmp, root).catch((err: NodeJS.ErrnoException) => {
        if (!existsSync(root)) throw err;
      });
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }
  return { package: request.package, suite: request.suite, version, arch: debArch, debPath, root, mirror };
}
