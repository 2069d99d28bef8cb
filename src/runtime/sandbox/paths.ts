import path from 'node:path';

/**
 * A sandbox's runtime directory: its QMP and ready sockets, the QEMU log and the guest console.
 * Keyed by the first 16 hex digits of the id rather than all 64, because a unix socket path must
 * fit in 108 bytes (sun_path) and `<stateDir>/vm/<64 hex>/ready.sock` would not under a long
 * state dir. 16 hex digits (64 random bits) do not collide in practice; a collision is still
 * detected at creation (the directory must not exist).
 */
export function sandboxWorkDir(stateDir: string, sandboxId: string): string {
  return path.join(stateDir, 'vm', sandboxId.slice(0, 16));
}

/** QEMU's `-name guest=` value, what `ps` shows next to the pid. */
export function vmNameFor(sandboxId: string): string {
  return `kata-ts-${sandboxId.slice(0, 16)}`;
}
