/**
 * The container core with crun's cgroupfs manager on a real cgroup2 hierarchy: a private cgroup
 * this test creates in the host's unified hierarchy, shown to crun as its /sys/fs/cgroup (see
 * host-crun.ts). Checks the layout (/kata-ts/<pod>/<container> from linux.cgroupsPath), stats
 * read from the container's cgroup, `kill --all` through cgroup.procs, and cleanup. The unified
 * hierarchy here has no memory controller, so OOM is covered by unit tests on fixture trees.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Containers } from '../../../guest/agent/containers/containers.js';
import { HAVE_CRUN, type HostCrun, startHostCrun, testSpec } from './host-crun.js';

/** The helper needs the hybrid layout's unified mount (these machines) to make its private tree. */
const HAVE_UNIFIED = existsSync('/sys/fs/cgroup/unified/cgroup.procs');

async function firstLine(stream: NodeJS.ReadableStream): Promise<string> {
  let text = '';
  for await (const c of stream) {
    text += String(c);
    if (text.includes('\n')) break;
  }
  return text.split('\n')[0]!;
}

describe.skipIf(!HAVE_CRUN || !HAVE_UNIFIED)('container core with the cgroupfs manager on a private cgroup2 tree', () => {
  let host: HostCrun;
  let containers: Containers;
  const pipes = { tty: false, stdin: false };

  beforeAll(async () => {
    host = await startHostCrun({ cgroup2: true });
    containers = new Containers({
      runtime: { command: host.command, stateDir: host.stateDir, cgroupManager: 'cgroupfs' },
      bundlesDir: host.bundlesDir,
      reaperPath: host.reaperPath,
      cgroupRoot: host.cgroupRoot!,
      // Reads the init's stdout pipe; the spool path is tested through the agent service.
      spoolOutput: false,
    });
  });

  afterAll(async () => {
    if (containers) for (const c of containers.list()) await containers.delete(c.id);
    host?.close();
  });

  it('places containers at their cgroupsPath, reads CPU that moves, kills all through the cgroup, removes the cgroup', async () => {
    const root = host.cgroupRoot!;
    const burn = await containers.create({
      id: 'burn',
      spec: testSpec(['sh', '-c', 'sleep 1000 & sleep 1000 & i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo burnt; wait'], {
        cgroupsPath: '/kata-ts/pod1/burn',
      }),
      rootfsPath: host.rootfs,
      stdio: pipes,
    });
    const dir = path.join(root, 'kata-ts/pod1/burn');
    expect(readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n')).toContain(String(burn.pid));
    const before = await containers.stats('burn');
    await containers.start('burn');
    expect(await firstLine(containers.process('burn').stdio.stdout!)).toBe('burnt');
    const after = await containers.stats('burn');
    expect(after.cpuUsageNs).toBeGreaterThan(before.cpuUsageNs);
    expect(after.oomKills).toBe(0n);
    // Two sleeps forked before "burnt" besides the init: `all` reaches every process of the cgroup.
    expect(readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').trim().split('\n').length).toBe(3);
    await containers.signal('burn', 9, true);
    expect(await containers.wait('burn')).toMatchObject({ exitCode: 137, oomKilled: false });
    // Stopped once waited for: a delete without force, right after, is not refused as running
    // (the wait once returned before the record said stopped; a pooled VM's warm-up met it).
    expect(containers.list().find((c) => c.id === 'burn')?.status).toBe('stopped');
    await containers.delete('burn', false);
    expect(existsSync(dir)).toBe(false);
    expect(existsSync(path.join(root, 'kata-ts/pod1'))).toBe(true);
  });

  it("a container sharing a PID namespace: when its init exits, what it left in its cgroup is killed, so its output ends (runc's shim does the same)", async () => {
    const root = host.cgroupRoot!;
    const spec = testSpec(['sh', '-c', 'sleep 1000 & echo forked; exit 3'], { cgroupsPath: '/kata-ts/pod1/shared' });
    // No PID namespace of its own (as a pod sharing one, or the host's here): its init's death
    // does not end the sleep by itself.
    const namespaces = (spec.linux as { namespaces?: Array<{ type: string }> } | undefined)?.namespaces ?? [];
    spec.linux = { ...spec.linux, namespaces: namespaces.filter((n) => n.type !== 'pid') };
    await containers.create({ id: 'shared', spec, rootfsPath: host.rootfs, stdio: pipes });
    const dir = path.join(root, 'kata-ts/pod1/shared');
    await containers.start('shared');
    const stdout = containers.process('shared').stdio.stdout!;
    let text = '';
    // The stream ends only when no process holds the pipe: the leftover sleep must be gone.
    for await (const c of stdout) text += String(c);
    expect(text).toBe('forked\n');
    expect(await containers.wait('shared')).toMatchObject({ exitCode: 3 });
    expect(readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').trim()).toBe('');
    await containers.delete('shared');
    expect(existsSync(dir)).toBe(false);
  });
});
