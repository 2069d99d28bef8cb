/** Loading the golden inputs of fixtures/oci, shared by the golden and rule tests. */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { OciSpecInput } from '../../../src/oci/index.js';

export const goldenDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../fixtures/oci');

/** The input file, plus `<name>.seccomp.json` as the Localhost profile's text when it exists. */
export function loadInput(name: string): OciSpecInput {
  const input = JSON.parse(readFileSync(path.join(goldenDir, `${name}.input.json`), 'utf8')) as OciSpecInput;
  const profile = path.join(goldenDir, `${name}.seccomp.json`);
  if (existsSync(profile)) input.seccompLocalhostProfile = readFileSync(profile, 'utf8');
  return input;
}

export { thrown } from '../../helpers/kata-error.js';
