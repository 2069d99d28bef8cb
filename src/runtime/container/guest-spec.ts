/**
 * The inputs of `buildOciSpec` that come from files: the image's /etc/passwd and /etc/group read
 * from the container's snapshot without ever leaving it, and the Localhost seccomp profile read
 * from the host path the request names. Plus the guest layout of one container (pure).
 */
import { constants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, errorMessage, invalid, isKataError } from '../../common/errors.js';
import type { OciGuestLayout, OciSpecInput } from '../../oci/index.js';
import { seccompLocalhostRef } from '../../oci/index.js';
import type { ContainerSpec } from '../spec/container.js';

const MAX_SYMLINKS = 40;
/** An image's passwd or group file larger than this is not read (the spec then has no names). */
const MAX_ETC_FILE_BYTES = 4 * 1024 * 1024;

/**
 * Read `rel` inside `root` as if `root` were `/`: every symlink on the way is resolved inside the
 * root (an absolute target restarts at the root, `..` stops at it), so an image whose /etc/passwd
 * is a link to /etc/shadow of the host reads the image's own file or nothing. Undefined when it
 * does not exist or is not a regular file.
 */
export async function readFileInRoot(root: string, rel: string, maxBytes = MAX_ETC_FILE_BYTES): Promise<string | undefined> {
  const pending = rel.split('/').filter((c) => c !== '' && c !== '.');
  const done: string[] = [];
  let hops = 0;
  while (pending.length > 0) {
    const part = pending.shift()!;
    if (part === '..') {
      done.pop();
      continue;
    }
    const here = path.join(root, ...done, part);
    let st: Awaited<ReturnType<typeof fsp.lstat>>;
    try {
      st = await fsp.lstat(here);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') return undefined;
      throw err;
    }
    if (st.isSymbolicLink()) {
      if (++hops > MAX_SYMLINKS) return undefined;
      const target = await fsp.readlink(here);
      if (target.startsWith('/')) done.length = 0;
      pending.unshift(...target.split('/').filter((c) => c !== '' && c !== '.'));
      continue;
    }
    done.push(part);
  }
  const final = path.join(root, ...done);
  let handle: fsp.FileHandle;
  try {
    handle = await fsp.open(final, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    if (['ENOENT', 'ELOOP', 'ENOTDIR', 'ENXIO'].includes(errnoCode(err) ?? '')) return undefined;
    throw err;
  }
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.size > maxBytes) return undefined;
    return await handle.readFile('utf8');
  } finally {
    await handle.close();
  }
}

/** A seccomp profile is a few KiB of JSON (Docker's default is 20 KiB); more is not one. */
export const MAX_SECCOMP_PROFILE_BYTES = 1024 * 1024;

/**
 * The Localhost seccomp profile's text, when the container names one (read from the host, as
 * root, as containerd and CRI-O read it: any absolute path the kubelet resolved, links followed,
 * since the kubelet's root may be one). Held to an absolute, normalised path of a regular file
 * (never a FIFO or device, which would block or stream) of at most MAX_SECCOMP_PROFILE_BYTES.
 */
export async function readSeccompProfile(spec: ContainerSpec): Promise<string | undefined> {
  const ref = seccompLocalhostRef(spec.linux?.security_context ?? null);
  if (ref === undefined) return undefined;
  const refuse = (why: string) =>
    invalid(
      'CONTAINER_SECCOMP_PROFILE_UNREADABLE',
      `container.linux.security_context.seccomp names Localhost profile "${ref}", which ${why}`,
    );
  if (!ref.startsWith('/') || ref.includes('\0') || ref.split('/').includes('..')) throw refuse('is not an absolute path without ".."');
  try {
    const handle = await fsp.open(ref, constants.O_RDONLY | constants.O_NONBLOCK);
    try {
      const st = await handle.stat();
      if (!st.isFile()) throw refuse('is not a regular file');
      if (st.size > MAX_SECCOMP_PROFILE_BYTES) throw refuse(`is larger than ${MAX_SECCOMP_PROFILE_BYTES} bytes`);
      return await handle.readFile('utf8');
    } finally {
      await handle.close();
    }
  } catch (err) {
    if (isKataError(err)) throw err;
    throw invalid(
      'CONTAINER_SECCOMP_PROFILE_UNREADABLE',
      `container.linux.security_context.seccomp names Localhost profile "${ref}", which cannot be read: ${errorMessage(err)}`,
    );
  }
}

/** Everything buildOciSpec needs, from the records and the files read above (pure). */
export function ociInput(opts: {
  container: ContainerSpec;
  sandbox: OciSpecInput['sandbox'];
  image: Record<string, unknown> | null;
  passwd: string | undefined;
  group: string | undefined;
  seccomp: string | undefined;
  guest: OciGuestLayout;
}): OciSpecInput {
  const input: OciSpecInput = {
    container: opts.container as OciSpecInput['container'],
    sandbox: opts.sandbox,
    image: opts.image as OciSpecInput['image'],
    guest: opts.guest,
  };
  if (opts.passwd !== undefined) input.imagePasswd = opts.passwd;
  if (opts.group !== undefined) input.imageGroup = opts.group;
  if (opts.seccomp !== undefined) input.seccompLocalhostProfile = opts.seccomp;
  return input;
}
