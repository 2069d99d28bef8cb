/**
 * The confined QEMU's jail on the host (the layout is planned by planJail, src/hypervisor/confine.ts):
 * `<workDir>/jail`, made a private bind mount of itself (so nothing mounted in it propagates to the
 * host's peers), holding /usr read-only, a tmpfs /dev with copies of exactly the device nodes the
 * pod needs (owned by its identity), the pod's VMM dir at its own path and the guest's files
 * read-only at theirs. All of its mounts are made by one `mount --all --fstab` and go with
 * releaseSharedMounts (at stop, and before the work dir is deleted). Argument arrays only.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { internal } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { type JailLayout, type JailSpec, planJail, ROOT_LINK_NAMES, type VmmIdentity } from '../../hypervisor/index.js';
import { releaseSharedMounts } from './shared-dir.js';

const TOOL_TIMEOUT_MS = 10_000;

function run(file: string, args: string[], cwd?: string): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: TOOL_TIMEOUT_MS, ...(cwd === undefined ? {} : { cwd }) }, (err, _stdout, stderr) => {
      if (err) reject(internal('VMM_JAIL_FAILED', `${file} ${args.join(' ')} failed: ${stderr.trim() || err.message}.`, { cause: err }));
      else resolve();
    });
  });
}

/** The host's top-level symlinks into /usr (merged /usr: `lib64 -> usr/lib64`), which the jail copies. */
export async function readRootLinks(root = '/'): Promise<Record<string, string>> {
  const links: Record<string, string> = {};
  for (const name of ROOT_LINK_NAMES) {
    const target = await fsp.readlink(path.join(root, name)).catch(() => undefined);
    if (target !== undefined && /^\/?usr\//.test(target)) links[name] = target;
  }
  return links;
}

/** The mount table file the jail's mounts are made from (outside the jail, root's). */
export function jailFstabFile(jailDir: string): string {
  return `${jailDir}.fstab`;
}

/**
 * Build the jail for `identity` (see the file's comment). The VMM dir must exist already (owned
 * by the identity). On failure the caller releases the jail's mounts (releaseJail), which is
 * registered before this runs.
 */
export async function buildJail(spec: Omit<JailSpec, 'rootLinks'>, identity: VmmIdentity): Promise<JailLayout> {
  const layout = planJail({ ...spec, rootLinks: await readRootLinks() });
  const { jailDir } = layout;
  await fsp.mkdir(jailDir, { mode: 0o755 });
  await fsp.chmod(jailDir, 0o755);
  for (const dir of layout.dirs) await fsp.mkdir(dir, { recursive: true, mode: 0o755 });
  for (const file of layout.fileMountPoints) await fsp.writeFile(file, '', { mode: 0o444 });
  for (const link of layout.symlinks) await fsp.symlink(link.target, link.path);
  const fstab = jailFstabFile(jailDir);
  await fsp.writeFile(fstab, layout.fstab, { mode: 0o600 });
  await run('mount', ['--all', '--fstab', fstab]);
  const devDir = path.join(jailDir, 'dev');
  for (const copy of layout.deviceCopies) await run('cp', ['-a', '--parents', '--', ...copy.sources, devDir], copy.cwd);
  for (const dir of layout.deviceDirs) await fsp.chmod(dir, 0o755);
  for (const node of layout.ownedDevices) {
    await fsp.chown(node, identity.uid, identity.gid);
    await fsp.chmod(node, 0o600);
  }
  for (const link of layout.sysfsLinks) await fsp.symlink(link.target, link.path);
  return layout;
}

/** Unmount everything of the jail, deepest first (QEMU must be gone); the files go with the work dir. */
export async function releaseJail(jailDir: string, log: Logger): Promise<void> {
  await releaseSharedMounts(jailDir, log);
}
