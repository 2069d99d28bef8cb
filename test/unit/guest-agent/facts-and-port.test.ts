import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { countCpuList, readGuestFacts } from '../../../guest/agent/facts.js';
import { AGENT_PORT_NAME, findPort } from '../../../guest/agent/port.js';

const roots: string[] = [];
function tree(files: Record<string, string>): string {
  const root = mkdtempSync(path.join(os.tmpdir(), 'agent-facts-'));
  roots.push(root);
  for (const [rel, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
    writeFileSync(path.join(root, rel), text);
  }
  return root;
}
afterEach(() => {
  for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
});

describe('guest facts', () => {
  it('counts kernel cpu lists', () => {
    expect(countCpuList('0-3,5\n')).toBe(5);
    expect(countCpuList('0\n')).toBe(1);
  });

  it('reads memory, cpus and the cgroup2 layout from proc and sys roots', async () => {
    const root = tree({
      'proc/meminfo': 'MemTotal:         399348 kB\nMemFree: 1 kB\n',
      'proc/uptime': '12.50 3.00\n',
      'sys/devices/system/cpu/online': '0-2\n',
      'sys/devices/system/memory/block_size_bytes': '8000000\n',
      'sys/devices/system/memory/memory0/online': '1\n',
      'sys/devices/system/memory/memory1/online': '1\n',
      'sys/devices/system/memory/memory2/online': '0\n',
      'sys/fs/cgroup/cgroup.controllers': 'cpu memory pids\n',
      'sys/fs/cgroup/cgroup.subtree_control': 'cpu memory\n',
    });
    const facts = await readGuestFacts(path.join(root, 'proc'), path.join(root, 'sys'));
    expect(facts).toMatchObject({
      onlineVcpus: 3,
      memoryKib: 399348,
      onlineMemoryKib: 2 * 128 * 1024,
      cgroupVersion: 2,
      cgroupControllers: ['cpu', 'memory'],
      uptimeSeconds: 12.5,
    });
  });
});

describe('findPort', () => {
  it('finds the device of the port named org.kata-ts.agent', async () => {
    const root = tree({
      'sys/class/virtio-ports/vport1p1/name': 'org.kata-ts.ready\n',
      'sys/class/virtio-ports/vport1p2/name': `${AGENT_PORT_NAME}\n`,
    });
    expect(await findPort(AGENT_PORT_NAME, path.join(root, 'sys'), '/dev')).toBe('/dev/vport1p2');
    await expect(findPort('org.nothing', path.join(root, 'sys'))).rejects.toMatchObject({ reason: 'AGENT_PORT_NOT_FOUND' });
  });
});
