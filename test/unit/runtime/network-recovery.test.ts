/**
 * What recovery does with a sandbox's pod network (the network layer faked, the records real, from
 * the format-3 fixture migrated to the current format): a sandbox whose VM is gone while CNI DEL
 * (or a joined namespace's unwiring) was still due gets it retried at start, and the record says
 * it is done; a creation cut short is torn down completely (TAP, DEL, namespace) and its record
 * deleted; a sandbox with nothing due is left alone.
 */
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createCgroupDriver } from '../../../src/cgroups/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { packageRoot } from '../../../src/common/paths.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import type { CniPodNetworkRecord, JoinedPodNetworkRecord, PodNetworkRecord, PodNetworks } from '../../../src/network/index.js';
import { RuntimeMetrics } from '../../../src/runtime/metrics.js';
import { SandboxManager } from '../../../src/runtime/sandbox/manager.js';
import { migrateSandboxRecord, SANDBOX_RECORD_KIND, type SandboxRecord } from '../../../src/runtime/sandbox/record.js';
import { RecordStore } from '../../../src/runtime/store.js';
import { testFacts } from '../../helpers/runtime-facts.js';

const FIXTURE_ID = 'a1'.repeat(32);

function networkOf(id: string, due: { cniAttached: boolean; tapWired: boolean }): CniPodNetworkRecord {
  const netnsName = `kata-ts-${id.slice(0, 16)}`;
  return {
    kind: 'cni',
    netnsName,
    netnsPath: `/run/netns/${netnsName}`,
    ifName: 'eth0',
    tapName: 'tap0_kata',
    cniNetwork: { cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'bridge' }], file: '/etc/cni/net.d/10.conflist' },
    attachment: { containerId: id, netnsPath: `/run/netns/${netnsName}`, ifName: 'eth0', args: '', runtimeConfig: {} },
    ...due,
    cniResult: null,
    result: null,
    mac: null,
    mtu: null,
  };
}

function joinedOf(netnsPath: string, tapWired: boolean): JoinedPodNetworkRecord {
  return {
    kind: 'joined',
    netnsName: netnsPath.startsWith('/run/netns/') ? netnsPath.slice('/run/netns/'.length) : null,
    netnsPath,
    ifName: 'eth0',
    tapName: 'tap0_kata',
    result: { ips: [{ address: '10.1.2.3', prefixLength: 24, family: 4 }], routes: [], dns: { servers: [], searches: [], options: [] } },
    mac: '0a:58:0a:01:02:03',
    mtu: 1500,
    tapWired,
  };
}

describe('recovery of pod networks', () => {
  let stateDir: string;
  beforeEach(async () => {
    stateDir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-netrec-'));
  });
  afterEach(async () => {
    await rm(stateDir, { recursive: true, force: true });
  });

  it('retries CNI DEL for a stopped sandbox, tears a cut-short creation down, leaves the rest', async () => {
    const logger = silentLogger();
    const store = new RecordStore<SandboxRecord>(stateDir, SANDBOX_RECORD_KIND, logger);
    const file = path.join(packageRoot(), 'fixtures', 'records', 'v3', 'sandboxes', `${FIXTURE_ID}.json`);
    const base = migrateSandboxRecord(3, JSON.parse(await readFile(file, 'utf8')).record) as SandboxRecord;
    const variant = (id: string, uid: string, patch: Partial<SandboxRecord>): SandboxRecord => ({
      ...structuredClone(base),
      id,
      metadata: { ...base.metadata, uid },
      // A pid that is not ours (start time 0 never matches): the VM counts as gone.
      vmm: base.vmm === null ? null : { ...base.vmm, pid: 999_999, startTimeTicks: 0, workDir: path.join(stateDir, 'vm', id.slice(0, 16)) },
      virtiofsd: null,
      placement: null,
      ...patch,
    });
    const stopped = variant('b1'.repeat(32), 'u-stopped', {
      phase: 'stopped',
      state: 'SANDBOX_NOTREADY',
      network: networkOf('b1'.repeat(32), { cniAttached: true, tapWired: false }),
    });
    // Cut short before QEMU was recorded (no cgroup to look for in this test's empty cgroup root).
    const creating = variant('c1'.repeat(32), 'u-creating', {
      phase: 'creating',
      vmm: null,
      network: networkOf('c1'.repeat(32), { cniAttached: true, tapWired: true }),
    });
    const clean = variant('d1'.repeat(32), 'u-clean', {
      phase: 'stopped',
      state: 'SANDBOX_NOTREADY',
      network: networkOf('d1'.repeat(32), { cniAttached: false, tapWired: false }),
    });
    // A caller's namespace (the shim's joinNetns): a stopped sandbox whose TAP is still wired, and
    // one cut short; PodNetworks undoes only the TAP of a joined one (test/integration/network/join.test.ts).
    const joinedStopped = variant('pod-joined-stopped', 'u-joined-stopped', {
      phase: 'stopped',
      state: 'SANDBOX_NOTREADY',
      network: joinedOf('/run/netns/cni-11111111-2222', true),
    });
    const joinedCreating = variant('pod-joined-creating', 'u-joined-creating', {
      phase: 'creating',
      vmm: null,
      network: joinedOf('/proc/1234/ns/net', true),
    });
    await mkdir(path.join(stateDir, 'sandboxes'), { recursive: true });
    for (const r of [stopped, creating, clean, joinedStopped, joinedCreating]) await store.put(r);

    const calls: Array<[string, string]> = [];
    const undo = async (net: PodNetworkRecord, persist: () => Promise<void>) => {
      net.tapWired = false;
      if (net.kind === 'cni') net.cniAttached = false;
      await persist();
    };
    const fake = {
      detach: async (net: PodNetworkRecord, persist: () => Promise<void>) => {
        calls.push(['detach', net.netnsPath]);
        await undo(net, persist);
      },
      teardown: async (net: PodNetworkRecord, persist: () => Promise<void>) => {
        calls.push(['teardown', net.netnsPath]);
        await undo(net, persist);
      },
    } as unknown as PodNetworks;
    const cgroups = createCgroupDriver('cgroupfs', { cgroupRoot: path.join(stateDir, 'no-cgroups'), dbusAddress: null, logger });
    const manager = new SandboxManager({
      config: { ...defaultConfig(), stateDir },
      facts: testFacts(),
      logger,
      metrics: new RuntimeMetrics(),
      cgroups,
      store,
      host: { cpus: 16, memoryMiB: 65536 },
      readPcieFacts: () => Promise.reject(new Error('not read during recovery')),
      cgroupDriverNamed: () => cgroups,
      network: fake,
      listener: { sandboxStopping: async () => {}, sandboxStopped: async () => {}, sandboxRemoving: async () => {} },
    });
    await manager.recover();

    const byPath = (a: [string, string], b: [string, string]) => (a[1] < b[1] ? -1 : 1);
    expect([...calls].sort(byPath)).toEqual(
      [
        ['detach', stopped.network!.netnsPath],
        ['teardown', creating.network!.netnsPath],
        ['detach', joinedStopped.network!.netnsPath],
        ['teardown', joinedCreating.network!.netnsPath],
      ].sort(byPath as (a: string[], b: string[]) => number),
    );
    const { records } = await store.load();
    expect(records.map((r) => r.id).sort()).toEqual([stopped.id, clean.id, joinedStopped.id].sort());
    expect(records.find((r) => r.id === stopped.id)!.network).toMatchObject({ cniAttached: false, tapWired: false });
    expect(records.find((r) => r.id === joinedStopped.id)!.network).toMatchObject({ kind: 'joined', tapWired: false });
    // Remove: the namespace goes too (teardown), even with nothing else due.
    await manager.remove(clean.id, {
      method: 'RemovePodSandbox',
      logger,
      signal: new AbortController().signal,
      deadlineMs: undefined,
      annotate: () => {},
    });
    expect(calls.at(-1)).toEqual(['teardown', clean.network!.netnsPath]);
  });
});
