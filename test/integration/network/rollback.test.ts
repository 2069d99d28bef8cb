/**
 * Pod networking refusals and rollback without booting a VM, in a node namespace of the test's
 * own with Debian's CNI plugins: a missing plugin makes NetworkReady false (naming it) and
 * RunPodSandbox FAILED_PRECONDITION before anything is made; a RunPodSandbox that fails after CNI
 * ADD (QEMU cannot start) leaves no namespace, veth, TAP or host-local allocation; a host-network
 * pod is INVALID_ARGUMENT.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectGrpcError } from '../../helpers/cri-expect.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { createNetworkNode, DEBIAN_CNI_BIN_DIR, type NetworkNode, podNetnsNames } from '../../helpers/network-node.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

describe('pod network refusals and rollback (real CNI plugins, no VM)', () => {
  let node: NetworkNode;
  let rt: TestRuntime;
  let partialBin: string;

  const setConfig = async (patch: (cfg: Record<string, Record<string, unknown>>) => void): Promise<void> => {
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, Record<string, unknown>>;
    patch(cfg);
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
  };
  const networkReady = async () => {
    const { status: s } = await rt.cri.runtime.Status({});
    return s!.conditions.find((c) => c.type === 'NetworkReady')!;
  };

  beforeAll(async () => {
    await ensureGuestAssets();
    node = await createNetworkNode();
    // A plugin directory without portmap: the node's config names a plugin that is not there.
    partialBin = path.join(node.dir, 'bin');
    await fsp.mkdir(partialBin);
    for (const p of ['bridge', 'host-local']) await fsp.symlink(path.join(DEBIAN_CNI_BIN_DIR, p), path.join(partialBin, p));
    rt = await createTestRuntime({ network: { ...node.networkConfig(), cniBinDirs: [partialBin] } }, { netnsPath: node.netnsPath });
    await rt.start();
  }, scaledMs(60_000));

  afterAll(async () => {
    await rt?.cleanup();
    await node?.cleanup();
  });

  it('a missing plugin: NetworkReady false naming it, RunPodSandbox refused before anything is made', async () => {
    const ready = await networkReady();
    expect(ready).toMatchObject({ status: false, reason: 'CniPluginMissing' });
    expect(ready.message).toContain('"portmap"');
    const before = await podNetnsNames(rt);
    await expectGrpcError(
      rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'no-portmap') }),
      status.FAILED_PRECONDITION,
      'CNI_PLUGIN_MISSING',
    );
    expect(await podNetnsNames(rt)).toEqual(before);
    expect(await node.allocations()).toEqual([]);
  });

  it('QEMU fails to start after CNI ADD: namespace, veth, TAP and allocation are all rolled back', async () => {
    const fakeQemu = path.join(node.dir, 'qemu-fails');
    await fsp.writeFile(fakeQemu, '#!/bin/sh\necho "no VM today" >&2\nexit 1\n', { mode: 0o755 });
    await setConfig((cfg) => {
      cfg.network = node.networkConfig();
      cfg.hypervisor = { ...cfg.hypervisor, qemuBinary: fakeQemu };
    });
    await rt.restart();
    expect(await networkReady()).toMatchObject({ status: true });
    const before = await podNetnsNames(rt);
    const linksBefore = await node.links();
    const err = await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'qemu-fails') }).catch((e: unknown) => e);
    expect(err).toMatchObject({ details: expect.stringMatching(/QEMU|qemu/) });
    expect(await podNetnsNames(rt)).toEqual(before);
    expect(await node.allocations()).toEqual([]);
    // The bridge may have been created by the first ADD; no veth is left on it.
    expect((await node.links()).filter((l) => !linksBefore.includes(l) && l !== node.bridge)).toEqual([]);
    const logs = await rt.logLines();
    expect(logs.some((l) => l.msg === 'pod network attached')).toBe(true);
    expect(logs.some((l) => l.msg === 'CNI DEL done')).toBe(true);
  });

  it('a host-network pod is INVALID_ARGUMENT', async () => {
    const config = podConfig(rt, 'hostnet');
    const linux = config.linux as { security_context: { namespace_options: Record<string, string> } };
    linux.security_context.namespace_options.network = 'NODE';
    const err = await expectGrpcError(rt.cri.runtime.RunPodSandbox({ config }), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/network/);
  });
});
