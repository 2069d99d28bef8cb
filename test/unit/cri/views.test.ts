import { describe, expect, it } from 'vitest';
import { containerUser } from '../../../src/cri/views/container.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';

const record = (guest: ContainerRecord['guest']) => ({ guest }) as ContainerRecord;

describe('containerUser', () => {
  it("reports the first process's uid, gid and groups from the container's OCI spec", () => {
    const ociSpec = {
      ociVersion: '1.0.2',
      root: { path: '/r' },
      process: { args: ['sh'], cwd: '/', user: { uid: 1000, gid: 1000, additionalGids: [1000, 1234, 50000] } },
    };
    const guest = { ociSpec, guestDevices: [], stopSignal: 'SIGTERM', rootfsGuestPath: '/r', hostDir: '/h', bindMounts: [] };
    expect(containerUser(record(guest))).toEqual({ linux: { uid: 1000, gid: 1000, supplemental_groups: [1000, 1234, 50000] } });
  });

  it('is null for a container created without a guest plan', () => {
    expect(containerUser(record(null))).toBeNull();
  });
});
