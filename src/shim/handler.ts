/**
 * Which kata-ts runtime handler a shim binary runs its pods with, from the binary's name (read by
 * the Task service and the metrics labels, before any sandbox record names it).
 */
import path from 'node:path';

/**
 * The kata-ts runtime handler a shim binary runs pods with: `containerd-shim-<handler>-v2` (the
 * name containerd derives from `runtime_type = "io.containerd.<handler>.v2"`), when the config
 * knows that handler; `kata-ts` otherwise.
 */
export function handlerForBinary(binary: string, known: readonly string[]): string {
  const m = /^containerd-shim-(.+)-v2$/.exec(path.basename(binary));
  return m?.[1] !== undefined && known.includes(m[1]) ? m[1] : 'kata-ts';
}
