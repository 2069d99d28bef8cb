/**
 * A container's root filesystem as an overlay of its image's layers (pure planning).
 *
 * The mount option string is limited to one page (the kernel copies mount(2)'s data into a
 * 4096-byte page, the last byte its NUL). Layer directories are named by their full diff id (64
 * hex digits: the key stays the content, no index to keep in step with the disk), so absolute
 * lowerdirs would cost about 100 bytes a layer and stop near 40 layers. Instead the lowerdirs are
 * relative, resolved from the working directory of the `mount` process (spawned with `cwd` = the
 * container's rootfs dir; the daemon never changes its own directory, which is process-wide), and
 * they name short links made per container, `l/<n>` -> the layer's directory: a few bytes a layer,
 * so every image up to overlayfs's own limit of 500 lower layers fits. The kernel resolves the
 * links once at mount time; the links live and die with the container's directory.
 */
import path from 'node:path';
import { invalid } from '../common/errors.js';
import './reasons.js';

/** mount(2) copies its options into one page; the last byte is the NUL. */
export const MOUNT_OPTIONS_MAX_BYTES = 4095;
/** overlayfs's OVL_MAX_STACK: the most lower layers one mount may stack. */
export const OVERLAY_MAX_LOWER_LAYERS = 500;

/** The directories one container's overlay uses, all under its own rootfs dir. */
export interface ContainerRootfsDirs {
  /** `<stateDir>/rootfs/<containerId>` */
  dir: string;
  upper: string;
  work: string;
  /** The mount point: the container's root filesystem. */
  merged: string;
  /** The short links to the layers (`l/<n>`). */
  links: string;
}

export function containerRootfsDirs(dir: string): ContainerRootfsDirs {
  return {
    dir,
    upper: path.join(dir, 'upper'),
    work: path.join(dir, 'work'),
    merged: path.join(dir, 'merged'),
    links: path.join(dir, 'l'),
  };
}

export interface OverlayMountPlan {
  /** Links to make before mounting: `<dir>/<name>` -> `target` (absolute). */
  links: Array<{ name: string; target: string }>;
  /** The `mount` command line (util-linux), run with `cwd`. */
  argv: string[];
  cwd: string;
  /** The -o argument, for logs and tests. */
  options: string;
}

/**
 * `lowerDirs` are the image's layer directories, **top layer first** (overlayfs's lowerdir order:
 * the leftmost is the uppermost). INVALID_ARGUMENT ROOTFS_TOO_MANY_LAYERS when the image stacks more
 * than overlayfs can, or when even the short form does not fit a page.
 */
export function planOverlayMount(lowerDirs: readonly string[], dir: string): OverlayMountPlan {
  if (lowerDirs.length === 0) throw invalid('ROOTFS_NO_LAYERS', 'the image has no layers to stack into a root filesystem');
  if (lowerDirs.length > OVERLAY_MAX_LOWER_LAYERS) {
    throw invalid(
      'ROOTFS_TOO_MANY_LAYERS',
      `the image has ${lowerDirs.length} layers; overlayfs stacks at most ${OVERLAY_MAX_LOWER_LAYERS}`,
      { details: { layers: lowerDirs.length } },
    );
  }
  for (const d of lowerDirs) {
    if (!path.isAbsolute(d) || d.includes(',') || d.includes(':'))
      throw invalid('ROOTFS_LAYER_PATH_INVALID', `layer directory ${JSON.stringify(d)} is not an absolute path without ',' or ':'`);
  }
  const dirs = containerRootfsDirs(dir);
  const links = lowerDirs.map((target, i) => ({ name: path.join('l', String(i)), target }));
  // Relative to cwd = dir: `l/0:l/1:...`, upper and work as `upper` and `work`.
  const options = [`lowerdir=${links.map((l) => l.name).join(':')}`, 'upperdir=upper', 'workdir=work'].join(',');
  if (Buffer.byteLength(options) > MOUNT_OPTIONS_MAX_BYTES) {
    throw invalid('ROOTFS_TOO_MANY_LAYERS', `the overlay options for ${lowerDirs.length} layers exceed one page`, {
      details: { layers: lowerDirs.length },
    });
  }
  return {
    links,
    argv: ['mount', '-t', 'overlay', '-o', options, '--', 'overlay', 'merged'],
    cwd: dirs.dir,
    options,
  };
}
