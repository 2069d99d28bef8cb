import { describe, expect, it } from 'vitest';
import { QmpClient } from '../../../src/hypervisor/qmp/client.js';
import { plugVcpus, setVirtioMemSize, vcpuDeviceId, virtioMemPluggedMiB } from '../../../src/hypervisor/resize.js';
import { loadTranscript, TranscriptReplay } from '../../helpers/hypervisor-qmp-replay.js';
import { rejection } from '../../helpers/kata-error.js';

describe('resize helpers replaying a QEMU 7.2 transcript', () => {
  it('plugs vCPUs into the free slots lowest core first, then refuses when none are left', async () => {
    const replay = new TranscriptReplay(loadTranscript('resize'));
    const qmp = await QmpClient.open(replay.client);
    expect(await plugVcpus(qmp, 2)).toEqual(['vcpu-s0-c2-t0', 'vcpu-s0-c3-t0']);
    const full = await rejection(plugVcpus(qmp, 1));
    expect(full).toMatchObject({ kind: 'exhausted', reason: 'VCPU_HOTPLUG_EXHAUSTED' });
    expect(full.message).toBe('1 more vCPUs were asked for but only 0 of 4 vCPU slots are free.');

    await setVirtioMemSize(qmp, 256, 1024);
    // QEMU reports what the guest plugged: nothing yet, as no guest runs in the recording.
    expect(await virtioMemPluggedMiB(qmp)).toBe(0);
    await qmp.quit();
    expect(replay.mismatches).toEqual([]);
    expect(replay.finished).toBe(true);
  });

  it('refuses bad sizes before talking to QEMU', async () => {
    const replay = new TranscriptReplay(loadTranscript('resize').slice(0, 3));
    const qmp = await QmpClient.open(replay.client);
    expect(await rejection(setVirtioMemSize(qmp, 2048, 1024))).toMatchObject({ kind: 'exhausted', reason: 'MEMORY_HOTPLUG_EXHAUSTED' });
    expect(await rejection(setVirtioMemSize(qmp, 3, 1024))).toMatchObject({ kind: 'invalid', reason: 'VIRTIO_MEM_SIZE_INVALID' });
    expect(await rejection(plugVcpus(qmp, 0))).toMatchObject({ kind: 'invalid', reason: 'VCPU_COUNT_INVALID' });
    expect(replay.sent).toHaveLength(1);
    qmp.close();
  });

  it('names vCPU devices by slot', () => {
    expect(vcpuDeviceId({ 'socket-id': 0, 'core-id': 5, 'thread-id': 0, 'node-id': 0 })).toBe('vcpu-s0-c5-t0');
  });
});
