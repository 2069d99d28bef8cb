/**
 * The config.json fixtures the decoders are tested against: fixtures/containerd/<version>/ and
 * fixtures/cri-o/<version>/. `*.config.synthetic.json` are written by hand from the managers'
 * sources (containerd 1.6.20's pkg/cri/server/sandbox_run_linux.go, container_create_linux.go,
 * pkg/cri/opts/spec_linux.go and oci/; CRI-O's server/sandbox_run_linux.go); `*.config.json`
 * are captured from a real manager and, when present, run through the same checks.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../../../../src/common/paths.js';

export const FIXTURE_ROOTS = ['containerd', 'cri-o'].map((d) => path.join(packageRoot(), 'fixtures', d));

export interface ConfigFixture {
  /** Relative to fixtures/, e.g. `containerd/1.6.20/sandbox.config.synthetic.json`. */
  name: string;
  file: string;
  synthetic: boolean;
  /** `<name>.decoded.json`: what the decoder must make of it. */
  golden: string;
}

function walk(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    return e.isDirectory() ? walk(full) : [full];
  });
}

export function configFixtures(): ConfigFixture[] {
  return FIXTURE_ROOTS.flatMap(walk)
    .filter((f) => /\.config(\.synthetic)?\.json$/.test(f))
    .sort()
    .map((file) => ({
      name: path.relative(path.join(packageRoot(), 'fixtures'), file),
      file,
      synthetic: file.endsWith('.synthetic.json'),
      golden: file.replace(/\.json$/, '.decoded.json'),
    }));
}

/** A fixture's JSON, parsed afresh (tests mutate their copy). */
export function loadConfig(name: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path.join(packageRoot(), 'fixtures', name), 'utf8')) as Record<string, unknown>;
}

/**
 * A config.json as the refusal tests edit it: any field may be set to anything, wrong types on
 * purpose, which is what the decoders must refuse.
 */
// biome-ignore lint/suspicious/noExplicitAny: untyped on purpose, to write malformed documents.
export type EditableJson = Record<string, any>;

/** The fixture with `edit` applied to a fresh copy. */
export function edited(name: string, edit: (oci: EditableJson) => void): EditableJson {
  const oci = loadConfig(name) as EditableJson;
  edit(oci);
  return oci;
}
