import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { errorMessage, unavailable } from '../common/errors.js';
import './reasons.js';
import { type ContainerdVersion, parseContainerdVersion } from './version.js';

const execFileAsync = promisify(execFile);

/** containerd's version from `<binary> --version` (the binary found on PATH, or a path). */
export async function detectContainerdVersion(binary = 'containerd'): Promise<ContainerdVersion> {
  let out: string;
  try {
    out = (await execFileAsync(binary, ['--version'], { timeout: 10_000 })).stdout;
  } catch (err) {
    throw unavailable(
      'CONTAINERD_VERSION_UNPARSABLE',
      `cannot run \`${binary} --version\` (${errorMessage(err).split('\n')[0]}); pass --containerd-version`,
    );
  }
  return parseContainerdVersion(out);
}
