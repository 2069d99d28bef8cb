/**
 * The sandbox's shared directory over virtio-9p (docs/templates.md, "virtio-fs: the decision"):
 * a VM cloned from a template cannot have virtio-fs (virtiofsd would map the template's RAM
 * file), so the runtime hot-plugs a `virtio-9p-pci` device with the same tag instead, served by
 * QEMU itself. The agent finds which of the two the VM has and mounts it at the same place, so
 * containers' rootfs and volumes look the same to everything after the mount.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';

/** virtio device ids (/sys/bus/virtio/devices/N/device). */
const VIRTIO_ID_FS = '0x001a';
const VIRTIO_ID_9P = '0x0009';

/**
 * 9p mount options: the Linux protocol dialect (owners, modes, xattrs); 256 KiB messages instead
 * of the 8 KiB default (each read or write of a container's file is at most one message); and
 * `cache=mmap`, the one cache mode that lets a process map a shared file writable (without it,
 * such an mmap fails, and programs that use one break) while other data is read through.
 */
export const NINEP_MOUNT_OPTIONS = 'trans=virtio,version=9p2000.L,msize=262144,cache=mmap';

export type SharedDeviceKind = 'virtiofs' | '9p';

/**
 * Which kind of shared-directory device the guest has: virtio-fs (any: its tag is checked at
 * mount), or a 9p device whose mount tag is `tag`. undefined while none is probed yet.
 */
export async function findSharedDevice(devicesDir: string, tag: string): Promise<SharedDeviceKind | undefined> {
  const names = await fsp.readdir(devicesDir).catch(() => [] as string[]);
  for (const name of names) {
    const id = (await fsp.readFile(path.join(devicesDir, name, 'device'), 'utf8').catch(() => '')).trim();
    if (id === VIRTIO_ID_FS) return 'virtiofs';
    if (id === VIRTIO_ID_9P) {
      // The tag file appears once the 9p driver has bound the device; it may end in a NUL.
      const mountTag = await fsp.readFile(path.join(devicesDir, name, 'mount_tag'), 'utf8').catch(() => '');
      if (mountTag.replace(/\0+$/, '').trim() === tag) return '9p';
    }
  }
  return undefined;
}

/** busybox mount's arguments for the share of `kind` with `tag` at `dir`. */
export function sharedMountArgs(kind: SharedDeviceKind, tag: string, dir: string): string[] {
  return kind === '9p' ? ['-t', '9p', '-o', NINEP_MOUNT_OPTIONS, tag, dir] : ['-t', 'virtiofs', tag, dir];
}
