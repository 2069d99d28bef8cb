/**
 * RunPodSandbox failures: each gets its precise gRPC status and leaves nothing behind: no QEMU,
 * no work dir, no record, no cgroup. Real QEMU throughout; one real daemon crash mid-creation.
 */
import { chmod, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { mountsUnder } from '../../../src/runtime/sandbox/shared-dir.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';

const NOTHING = { processes: [], workDirs: [], records: [], cgroups: [] };

describe('RunPodSandbox failures roll back completely', () => {
  const runtimes: TestRuntime[] = [];
  async function runtimeWith(doc: Record<string, unknown> = {}): Promise<TestRuntime> {
    const rt = await createTestRuntime(doc);
    runtimes.push(rt);
    await rt.start();
    return rt;
  }
  beforeAll(async () => {
    await ensureGuestAssets();
  });
  afterEach(async () => {
    for (const rt of runtimes.splice(0)) await rt.cleanup();
  });

  it('bad requests are refused before anything starts, naming the field', async () => {
    const rt = await runtimeWith();
    const err = await expectGrpcError(
      rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'x'), runtime_handler: 'runc' }),
      status.NOT_FOUND,
      'HANDLER_UNKNOWN',
    );
    expect(err.details).toContain('kata-ts, kata-ts-cvm');
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ runtime_handler: '' }), status.INVALID_ARGUMENT, 'SANDBOX_CONFIG_MISSING');
    const noName = podConfig(rt, 'x');
    (noName.metadata as { name: string }).name = '';
    const e2 = await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: noName }), status.INVALID_ARGUMENT, 'SANDBOX_METADATA_INVALID');
    expect(e2.details).toContain('config.metadata.name');
    // A systemd-style parent under the cgroupfs driver the runtime advertises.
    const wrongStyle = podConfig(rt, 'x', { linux: { cgroup_parent: '/kubepods.slice/kubepods-besteffort.slice' } });
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: wrongStyle }), status.FAILED_PRECONDITION, 'CGROUP_PARENT_STYLE_MISMATCH');
    // More vCPUs than this host has.
    const huge = podConfig(rt, 'x', {
      pod_resources: {
        containers: [{ name: 'a', type: 'REGULAR_CONTAINER', kubernetes_resources: { requests: { cpu: { string: '500' } }, limits: {} } }],
      },
    });
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: huge }), status.RESOURCE_EXHAUSTED);
    expect(await leftovers(rt)).toEqual(NOTHING);
  });

  it('a missing guest kernel is FAILED_PRECONDITION naming the path', async () => {
    const rt = await runtimeWith({ hypervisor: { kernelPath: '/nonexistent/vmlinuz' } });
    const err = await expectGrpcError(
      rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'nokernel') }),
      status.FAILED_PRECONDITION,
      'GUEST_ASSETS_MISSING',
    );
    expect(err.details).toContain('/nonexistent/vmlinuz');
    expect(await leftovers(rt)).toEqual(NOTHING);
  });

  it('a QEMU that exits at start is reported with its own error, and nothing is left', async () => {
    const rt = await createTestRuntime();
    runtimes.push(rt);
    // The real QEMU, told an option it does not know: it exits during start, as a bad build or
    // a broken host would make it.
    const wrapper = path.join(rt.dir, 'qemu-bad-option');
    await writeFile(wrapper, '#!/bin/sh\nexec qemu-system-x86_64 -no-such-option "$@"\n');
    await chmod(wrapper, 0o755);
    const cfg = JSON.parse(await (await import('node:fs/promises')).readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    await writeFile(rt.configPath, JSON.stringify({ ...cfg, hypervisor: { qemuBinary: wrapper } }));
    await rt.start();
    const err = await expectGrpcError(
      rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'badqemu') }),
      status.INTERNAL,
      'QEMU_EXITED_AT_START',
    );
    expect(err.details).toMatch(/-no-such-option/);
    expect(await leftovers(rt)).toEqual(NOTHING);
  });

  it('a guest that never signals ready times out with DEADLINE_EXCEEDED and is rolled back', async () => {
    // Too short for any boot: the guest is still in firmware when the wait ends.
    const rt = await runtimeWith({ hypervisor: { readyTimeoutMs: 300 } });
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'slow') }), status.DEADLINE_EXCEEDED, 'GUEST_READY_TIMEOUT');
    expect(await leftovers(rt)).toEqual(NOTHING);
    // The same pod can be tried again: the failed attempt left no identity behind either.
    await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'slow') }), status.DEADLINE_EXCEEDED, 'GUEST_READY_TIMEOUT');
  });

  it('a daemon killed in the middle of RunPodSandbox: the next start rolls the creation back', async () => {
    const rt = await runtimeWith();
    const call = rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'crash') }).catch((e: unknown) => e);
    // Wait until QEMU runs for it (its VMM dir holds the QMP socket: confined by default), then kill -9 the daemon.
    const vmRoot = path.join(rt.stateDir, 'vm');
    for (let i = 0; i < 200; i++) {
      const dirs = await readdir(vmRoot).catch(() => [] as string[]);
      if (dirs.length > 0 && (await readdir(path.join(vmRoot, dirs[0]!, 'vmm')).catch(() => [] as string[])).includes('qmp.sock')) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    process.kill(rt.pid(), 'SIGKILL');
    expect(await call).toBeInstanceOf(Error);
    const before = await leftovers(rt);
    // The half-created VM and its virtiofsd (two processes: sandbox=namespace forks) outlived the
    // daemon, and the shared dir is mounted (in the runtime's mount namespace).
    expect(before.processes.length).toBe(3);
    expect(mountsUnder(await rt.mountinfo(), vmRoot).length).toBeGreaterThan(0);
    await rt.start();
    const list = await rt.cri.runtime.ListPodSandbox({});
    expect(list.items).toEqual([]);
    // The pod's parent cgroups belong to whoever made them (a kubelet, here the test); the VMM's own
    // cgroup must be gone even when the crash came between placing the VMM and recording it.
    expect(await leftovers(rt, { vmmCgroupsOnly: true })).toEqual(NOTHING);
    expect(mountsUnder(await rt.mountinfo(), vmRoot)).toEqual([]);
    expect(mountsUnder(await readFile('/proc/self/mountinfo', 'utf8'), vmRoot)).toEqual([]);
  });
});
