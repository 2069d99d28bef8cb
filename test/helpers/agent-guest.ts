import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';

/**
 * The guest with the real agent, in the test cache (KATA_TS_AGENT_GUEST_DIR, else
 * .cache/guest-agent), built by scripts/build-guest.sh when missing or out of date; never the
 * installed one.
 */
export function ensureAgentGuest(): { kernelPath: string; initrdPath: string; guestImagePath: string } {
  const repo = packageRoot();
  const dir = process.env.KATA_TS_AGENT_GUEST_DIR ?? path.join(repo, '.cache/guest-agent');
  execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
  return {
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initramfs.cpio.gz'),
    guestImagePath: path.join(dir, 'guest.img'),
  };
}
