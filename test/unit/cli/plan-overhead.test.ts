/**
 * `kata-ts plan --overhead`: the RuntimeClass's overhead.podFixed from the handler's VMM budget,
 * and deploy/runtimeclass-*.yaml holding exactly what it prints for the default config (so the
 * manifests cannot drift from the defaults).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { runtimeClassOverhead, runtimeClassYaml } from '../../../src/cli/plan/overhead.js';
import { runPlanCommand } from '../../../src/cli/plan.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';

function sink(): { stream: Writable; text: () => string } {
  let text = '';
  return {
    stream: new Writable({
      write(chunk, _enc, cb) {
        text += String(chunk);
        cb();
      },
    }),
    text: () => text,
  };
}

describe('plan --overhead', () => {
  it.each(['kata-ts', 'kata-ts-cvm'])(
    'deploy/runtimeclass-%s.yaml is exactly the printed RuntimeClass for the default config',
    (handler) => {
      const file = readFileSync(path.join(packageRoot(), 'deploy', `runtimeclass-${handler}.yaml`), 'utf8');
      const config = defaultConfig();
      expect(file).toBe(runtimeClassYaml(runtimeClassOverhead(config, handler, 'any')));
      const doc = parse(file) as { metadata: { name: string }; handler: string; overhead: { podFixed: Record<string, string> } };
      expect(doc.handler).toBe(handler);
      expect(doc.metadata.name).toBe(handler);
      // The VMM's own budget plus QEMU's TCG translation cache (the defaults' acceleration is auto).
      const h = config.handlers[handler]!;
      expect(doc.overhead.podFixed).toEqual({
        cpu: `${h.vmmOverhead.cpuMillicores}m`,
        memory: `${h.vmmOverhead.memoryMiB + config.hypervisor.tcgTranslationCacheMiB}Mi`,
      });
    },
  );

  it("follows the config: a handler's vmmOverhead, and no translation cache where acceleration is kvm", () => {
    const config = defaultConfig();
    config.handlers['kata-ts']!.vmmOverhead = { cpuMillicores: 250, memoryMiB: 200 };
    expect(runtimeClassOverhead(config, 'kata-ts', 'kvm')).toMatchObject({ cpuMillicores: 250, memoryMiB: 200 });
    expect(runtimeClassOverhead(config, 'kata-ts', 'tcg')).toMatchObject({ cpuMillicores: 250, memoryMiB: 264 });
  });

  it('the command: --format json, --accel, and usage errors', async () => {
    const out = sink();
    const err = sink();
    const io = { stdout: out.stream, stderr: err.stream };
    const cfg = path.join(packageRoot(), 'deploy', 'config.example.json');
    expect(
      await runPlanCommand(['--overhead', '--config', cfg, '--handler', 'kata-ts-cvm', '--format', 'json', '--accel', 'kvm'], io),
    ).toBe(0);
    const obj = JSON.parse(out.text()) as { kind: string; handler: string; overhead: { podFixed: { memory: string } } };
    expect(obj).toMatchObject({ kind: 'RuntimeClass', handler: 'kata-ts-cvm' });
    expect(await runPlanCommand(['--overhead', '--config', cfg, '--handler', 'nope'], io)).toBe(2);
    expect(err.text()).toContain('--handler "nope" is not a handler of the config');
    expect(await runPlanCommand(['--overhead', '--config', cfg, '--accel', 'fast'], io)).toBe(2);
  });
});
