import { describe, expect, it } from 'vitest';
import type { GuestReport } from '../../../../src/hypervisor/index.js';
import { type ClaimBudget, growToShape } from '../../../../src/runtime/pool/claim.js';

const MiB = 1024 * 1024;

/** A QMP double that records what growToShape sent and plugs virtio-mem after `plugAfterPolls` reads. */
function fakeVm(opts: { freeSlots: number; plugAfterPolls: number; reportVcpus: number; reports?: GuestReport[] }) {
  const sent: string[] = [];
  let requestedMiB = 0;
  let polls = 0;
  const qmp = {
    async queryHotpluggableCpus() {
      return Array.from({ length: opts.freeSlots }, (_, i) => ({
        type: 'host-x86_64-cpu',
        'vcpus-count': 1,
        props: { 'socket-id': i + 1, 'core-id': 0, 'thread-id': 0 },
      }));
    },
    async deviceAdd(args: { id: string }) {
      sent.push(`device_add ${args.id}`);
    },
    async qomSet(_path: string, prop: string, value: number) {
      sent.push(`qom-set ${prop} ${value / MiB}`);
      requestedMiB = value / MiB;
    },
    async qomGet(_path: string, prop: string) {
      polls++;
      sent.push(`qom-get ${prop}`);
      return (polls > opts.plugAfterPolls ? requestedMiB : 0) * MiB;
    },
  };
  const vm = {
    qmp,
    /** The first of the reports the guest sends (in order) that the predicate takes. */
    async waitForGuestReport(predicate: (r: GuestReport) => boolean) {
      const reports = opts.reports ?? [{ vcpus: opts.reportVcpus, memoryKiB: 1024 * 1024 } as GuestReport];
      const report = reports.find(predicate);
      if (report === undefined) throw new Error('GUEST_REPORT_TIMEOUT');
      return report;
    },
  };
  return { vm: vm as unknown as Parameters<typeof growToShape>[0], sent };
}

function budget(ms: number): ClaimBudget {
  const started = Date.now();
  const remainingMs = () => Math.max(1, ms - (Date.now() - started));
  return {
    remainingMs,
    signal: new AbortController().signal,
    checkBudget: () => {
      if (Date.now() - started >= ms) throw new Error('budget spent');
    },
  };
}

describe('growToShape (shared by the pool claim and a clone)', () => {
  it('plugs the missing vCPUs, sets virtio-mem and waits until the guest plugged it', async () => {
    const { vm, sent } = fakeVm({ freeSlots: 3, plugAfterPolls: 2, reportVcpus: 3 });
    const guest = await growToShape(vm, { addVcpus: 2, virtioMemMiB: 256, virtioMemMaxMiB: 512 }, { vcpus: 3 }, budget(10_000));
    expect(guest).toEqual({ vcpus: 3, memoryKiB: 1024 * 1024 });
    expect(sent.filter((s) => s.startsWith('device_add'))).toHaveLength(2);
    expect(sent).toContain('qom-set requested-size 256');
    // Read until the guest's plugged size reached the request (two reads below it, one at it).
    expect(sent.filter((s) => s === 'qom-get size')).toHaveLength(3);
  });

  it('sends nothing when the VM already has the shape', async () => {
    const { vm, sent } = fakeVm({ freeSlots: 1, plugAfterPolls: 0, reportVcpus: 1 });
    await growToShape(vm, { addVcpus: 0, virtioMemMiB: 0, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(10_000));
    expect(sent).toEqual([]);
  });

  it("answers a clone's known size at once when it needs no growth: its guest sends no report then", async () => {
    // A clone's guest reports only a size that changed; the fake has no report at all to give.
    const { vm, sent } = fakeVm({ freeSlots: 1, plugAfterPolls: 0, reportVcpus: 1, reports: [] });
    const before = { vcpus: 1, memoryKiB: 204_292, onlineMemoryKiB: 262_144 };
    const guest = await growToShape(vm, { addVcpus: 0, virtioMemMiB: 0, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(10_000), before);
    expect(guest).toEqual({ vcpus: 1, memoryKiB: 204_292 });
    expect(sent).toEqual([]);
    // Without the size known, the same VM waits for a report (and here finds none).
    await expect(growToShape(vm, { addVcpus: 0, virtioMemMiB: 0, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(10_000))).rejects.toThrow(
      'GUEST_REPORT_TIMEOUT',
    );
  });

  it('with the size before known, takes the report that shows all the plugged memory online, not one sent midway', async () => {
    const report = (onlineMiB: number): GuestReport => ({
      kind: 'update',
      vcpus: 1,
      memoryKiB: onlineMiB * 900,
      onlineMemoryKiB: onlineMiB * 1024,
    });
    const { vm } = fakeVm({ freeSlots: 1, plugAfterPolls: 0, reportVcpus: 1, reports: [report(384), report(512)] });
    const before = { vcpus: 1, memoryKiB: 256 * 900, onlineMemoryKiB: 256 * 1024 };
    const guest = await growToShape(vm, { addVcpus: 0, virtioMemMiB: 256, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(10_000), before);
    expect(guest).toEqual({ vcpus: 1, memoryKiB: 512 * 900 });
  });

  it('fails when the guest does not plug the memory within the budget', async () => {
    const { vm } = fakeVm({ freeSlots: 1, plugAfterPolls: Number.POSITIVE_INFINITY, reportVcpus: 1 });
    await expect(growToShape(vm, { addVcpus: 0, virtioMemMiB: 128, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(300))).rejects.toThrow(
      /budget spent|did not plug 128 MiB/,
    );
  });

  it('refuses more memory than the headroom before sending anything', async () => {
    const { vm, sent } = fakeVm({ freeSlots: 1, plugAfterPolls: 0, reportVcpus: 1 });
    await expect(growToShape(vm, { addVcpus: 0, virtioMemMiB: 1024, virtioMemMaxMiB: 512 }, { vcpus: 1 }, budget(10_000))).rejects.toThrow(
      /exceeds the 512 MiB/,
    );
    expect(sent).toEqual([]);
  });
});
