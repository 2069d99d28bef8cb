/**
 * Runs INSIDE a throwaway pod VM (see guest-vm.test.ts): the container core with the guest's
 * cgroup2 and crun's cgroupfs manager. Prints one line `H6RESULT <json>` on the console.
 */
import { readFileSync } from 'node:fs';
import { Containers } from '../../../guest/agent/containers/containers.js';
import { rootIsInitramfs } from '../../../guest/agent/containers/runtime.js';
import type { OciSpec } from '../../../guest/agent/containers/types.js';
import { testSpec } from './host-crun.js';

const MiB = 1024 * 1024;

function withMemory(spec: OciSpec, limitBytes: number): OciSpec {
  return { ...spec, linux: { ...spec.linux, resources: { memory: { limit: limitBytes } } } };
}

async function scenarios(noPivot: boolean): Promise<Record<string, unknown>> {
  const containers = new Containers({
    runtime: { command: ['/usr/bin/crun'], stateDir: '/run/crun', cgroupManager: 'cgroupfs', noPivot },
    bundlesDir: '/run/h6/bundles',
    reaperPath: '/h6/kata-ts-reaper',
    cgroupRoot: '/sys/fs/cgroup',
  });
  const out: Record<string, unknown> = { noPivot };
  const pipes = { tty: false, stdin: false };
  const rootfsPath = '/h6/rootfs';

  const oomSpec = withMemory(testSpec(['awk', 'BEGIN { s = "x"; while (1) s = s s }'], { cgroupsPath: '/kata-ts/pod1/oom' }), 16 * MiB);
  await containers.create({ id: 'oom', spec: oomSpec, rootfsPath, stdio: pipes });
  await containers.start('oom');
  out.oom = await containers.wait('oom');
  out.oomStats = await containers.stats('oom');
  await containers.delete('oom');

  // A child killed by the OOM killer while the init lives: told as it happens (the init is still
  // running when the event comes), then the init's own exit, 0.
  const events: string[] = [];
  containers.onEvent((e) => {
    if (e.id === 'child') events.push(e.kind === 'oom' ? `oom ${e.count} ${containers.state('child').status}` : e.kind);
  });
  const childSpec = withMemory(
    testSpec(['sh', '-c', 'awk \'BEGIN { s = "x"; while (1) s = s s }\'; echo "awk ended $?"; sleep 3; exit 0'], {
      cgroupsPath: '/kata-ts/pod1/child',
    }),
    16 * MiB,
  );
  await containers.create({ id: 'child', spec: childSpec, rootfsPath, stdio: pipes });
  await containers.start('child');
  out.child = await containers.wait('child');
  out.childEvents = events;
  await containers.delete('child');

  await containers.create({
    id: 'three',
    spec: testSpec(['sh', '-c', 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 3'], { cgroupsPath: '/kata-ts/pod1/three' }),
    rootfsPath,
    stdio: pipes,
  });
  await containers.start('three');
  out.three = await containers.wait('three');
  out.threeStats = await containers.stats('three');
  await containers.delete('three');

  await containers.create({
    id: 'all',
    spec: testSpec(['sh', '-c', 'sleep 1000 & sleep 1000'], { cgroupsPath: '/kata-ts/pod1/all' }),
    rootfsPath,
    stdio: pipes,
  });
  await containers.start('all');
  await containers.signal('all', 9, true);
  out.all = await containers.wait('all');
  await containers.delete('all');
  return out;
}

const replacer = (_k: string, v: unknown) => (typeof v === 'bigint' ? v.toString() : v);
const result: Record<string, unknown> = { initramfsRoot: rootIsInitramfs(readFileSync('/proc/self/mountinfo', 'utf8')) };
// First as the agent would (no pivot_root exactly when the root is the initramfs), then the
// other way, to record what pivot_root does here.
for (const noPivot of [result.initramfsRoot === true, result.initramfsRoot !== true]) {
  const key = noPivot ? 'noPivot' : 'pivot';
  try {
    result[key] = await scenarios(noPivot);
  } catch (err) {
    result[`${key}Error`] = { message: String(err), details: (err as { details?: unknown }).details };
  }
}
console.log(`H6RESULT ${JSON.stringify(result, replacer)}`);
