import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
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
