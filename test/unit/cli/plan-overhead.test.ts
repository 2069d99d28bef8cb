/**
 * `kata-ts plan --overhead`: the RuntimeClass's overhead.podFixed, everything a pod costs beyond its
 * containers' limits (guest overhead, VMM, translation cache, balloon); deploy/runtimeclass-*.yaml
 * holding exactly what it prints for the default config (so the manifests cannot drift from the
 * defaults); and sizing agreeing with it: a pod sent that overhead fits its kubelet cgroup.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { type OverheadAccel, runtimeClassOverhead, runtimeClassYaml } from '../../../src/cli/plan/overhead.js';
import { runPlanCommand } from '../../../src/cli/plan.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { BALLOON_DEVICE_MIB } from '../../../src/hypervisor/argv.js';
import type { PodSandboxConfigInput } from '../../../src/sizing/input.js';
import { planSizing } from '../../../src/sizing/shape.js';
import { BIG_HOST, handlerNamed, podWith } from '../../helpers/sizing-pods.js';

const MiB = 1024 * 1024;

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
      // Guest and VMM overhead, QEMU's TCG translation cache (the defaults' acceleration is auto)
      // and, where free page reporting is on, the balloon device.
      const h = config.handlers[handler]!;
      const balloonMiB = h.vm.freePageReporting && !h.confidential ? BALLOON_DEVICE_MIB : 0;
      expect(doc.overhead.podFixed).toEqual({
        cpu: `${h.guestOverhead.cpuMillicores + h.vmmOverhead.cpuMillicores}m`,
        memory: `${h.guestOverhead.memoryMiB + h.vmmOverhead.memoryMiB + config.hypervisor.tcgTranslationCacheMiB + balloonMiB}Mi`,
      });
    },
  );

  it("follows the config: a handler's overheads, and no translation cache where acceleration is kvm", () => {
    const config = defaultConfig();
    config.handlers['kata-ts']!.vmmOverhead = { cpuMillicores: 250, memoryMiB: 200 };
    config.handlers['kata-ts']!.guestOverhead = { cpuMillicores: 300, memoryMiB: 100 };
    expect(runtimeClassOverhead(config, 'kata-ts', 'kvm')).toMatchObject({ cpuMillicores: 550, memoryMiB: 301 });
    expect(runtimeClassOverhead(config, 'kata-ts', 'tcg')).toMatchObject({ cpuMillicores: 550, memoryMiB: 365 });
    config.handlers['kata-ts']!.vm.freePageReporting = false;
    expect(runtimeClassOverhead(config, 'kata-ts', 'kvm')).toMatchObject({ memoryMiB: 300 });
  });

  it.each<[string, OverheadAccel, boolean]>([
    ['kata-ts', 'tcg', true],
    ['kata-ts', 'kvm', false],
    ['kata-ts-cvm', 'tcg', true],
  ])('a %s pod sent exactly podFixed (%s) fits the kubelet cgroup it makes, and plans as with no overhead', (handler, accel, tcg) => {
    const config = defaultConfig();
    const o = runtimeClassOverhead(config, handler, accel);
    const profile = config.handlers[handler]!;
    const sizingFor = (overhead: PodSandboxConfigInput['linux']) => {
      const pod = podWith([{ name: 'app', limits: { cpu: '1500m', memory: '1536Mi' } }]);
      pod.linux = overhead;
      return planSizing({
        config: pod,
        handler: handlerNamed(handler, config),
        host: BIG_HOST,
        translationCacheMiB: tcg ? config.hypervisor.tcgTranslationCacheMiB : 0,
        balloonMiB: profile.vm.freePageReporting && !profile.confidential ? BALLOON_DEVICE_MIB : 0,
      });
    };
    const sent = sizingFor({
      cgroup_parent: '',
      resources: null,
      overhead: {
        cpu_period: '100000',
        cpu_quota: String(o.cpuMillicores * 100),
        cpu_shares: String(Math.ceil((o.cpuMillicores * 1024) / 1000)),
        memory_limit_in_bytes: String(o.memoryMiB * MiB),
      },
    });
    expect(sent.overheadShortfallBytes).toBeUndefined();
    // The kubelet's pod cgroup: the containers' limits plus podFixed.
    expect(sent.host.memoryLimitBytes).toBeLessThanOrEqual(1536 * MiB + o.memoryMiB * MiB);
    // What a kubelet sends for a RuntimeClass without overhead: an empty one.
    const none = sizingFor({
      cgroup_parent: '',
      resources: null,
      overhead: { cpu_period: '0', cpu_quota: '0', cpu_shares: '0', memory_limit_in_bytes: '0' },
    });
    expect(none.overheadShortfallBytes).toBeGreaterThan(0);
    expect({ ...sent.vm, host: sent.host }).toEqual({ ...none.vm, host: none.host });
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
