import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { buildOciSpec } from '../../../src/oci/index.js';
import { goldenDir, loadInput } from './load.js';

const cases = readdirSync(goldenDir)
  .filter((f) => f.endsWith('.input.json'))
  .map((f) => f.slice(0, -'.input.json'.length))
  .sort();

const render = (value: unknown): string => `${JSON.stringify(value, null, 2)}\n`;

function compare(file: string, actual: string): void {
  if (process.env.UPDATE_GOLDENS === '1') writeFileSync(file, actual);
  expect(actual).toBe(readFileSync(file, 'utf8'));
}

describe('buildOciSpec goldens (fixtures/oci, UPDATE_GOLDENS=1 rewrites them)', () => {
  it('has golden cases', () => {
    expect(cases.length).toBeGreaterThanOrEqual(6);
  });

  it.each(cases)('%s', (name) => {
    const plan = buildOciSpec(loadInput(name));
    // <name>.spec.json is the config.json itself; <name>.files.json what else the plan says.
    compare(path.join(goldenDir, `${name}.spec.json`), render(plan.spec));
    compare(path.join(goldenDir, `${name}.files.json`), render({ files: plan.files, stopSignal: plan.stopSignal }));
    expect(buildOciSpec(loadInput(name))).toEqual(plan);
  });
});
