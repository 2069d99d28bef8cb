import { describe, expect, it } from 'vitest';
import { parseGuestLine } from '../../../src/hypervisor/guest-protocol.js';

describe('parseGuestLine', () => {
  it('parses the ready line guest/init writes (recorded from a real boot)', () => {
    expect(parseGuestLine('KATA_TS_READY vcpus=2 memory_kib=399348 online_memory_kib=524288 kernel=6.1.0-56-amd64\n')).toEqual({
      kind: 'ready',
      vcpus: 2,
      memoryKiB: 399348,
      onlineMemoryKiB: 524288,
      kernelRelease: '6.1.0-56-amd64',
    });
  });

  it('parses updates and power-off, ignoring unknown fields', () => {
    expect(parseGuestLine('KATA_TS_UPDATE vcpus=3 memory_kib=661492 online_memory_kib=786432 future=x')).toEqual({
      kind: 'update',
      vcpus: 3,
      memoryKiB: 661492,
      onlineMemoryKiB: 786432,
    });
    expect(parseGuestLine('KATA_TS_POWEROFF')).toEqual({ kind: 'poweroff' });
  });

  it.each([
    '',
    'hello',
    'KATA_TS_READY vcpus=2',
    'KATA_TS_READY vcpus=-1 memory_kib=1 online_memory_kib=1',
    'KATA_TS_UPDATE vcpus=x memory_kib=1 online_memory_kib=1',
  ])('rejects %j', (line) => {
    expect(parseGuestLine(line)).toBeUndefined();
  });
});
