/** The one exec process builder that ExecSync and the streaming Exec share (pure). */
import { describe, expect, it } from 'vitest';
import type { OciSpec } from '../../../src/oci/index.js';
import { execOciProcess, execProcessRequest } from '../../../src/runtime/container/exec-process.js';
import type { ContainerGuestPlan } from '../../../src/runtime/container/record.js';

const ociSpec: OciSpec = {
  ociVersion: '1.0.2',
  root: { path: '/run/kata-ts/shared/containers/c1/rootfs' },
  process: {
    terminal: false,
    user: { uid: 1000, gid: 100, additionalGids: [100, 27] },
    args: ['/app/server', '--port', '80'],
    env: ['PATH=/usr/bin:/bin', 'HOME=/home/app'],
    cwd: '/srv',
    capabilities: { bounding: ['CAP_NET_BIND_SERVICE'], effective: ['CAP_NET_BIND_SERVICE'] },
    noNewPrivileges: true,
    oomScoreAdj: 500,
  },
};
const guest: ContainerGuestPlan = {
  ociSpec,
  guestDevices: [],
  stopSignal: 'SIGTERM',
  rootfsGuestPath: '/r',
  hostDir: '/h',
  bindMounts: [],
};
const record = { id: 'c1', guest };

describe('execProcessRequest', () => {
  it("runs the command with the container's own identity, env, cwd and capabilities", () => {
    const request = execProcessRequest(record, { execId: 'e1', cmd: ['cat', '/etc/hostname'], tty: false, stdin: true });
    expect(request).toEqual({
      containerId: 'c1',
      execId: 'e1',
      ociProcessJson: expect.any(String),
      tty: false,
      stdin: true,
    });
    expect(JSON.parse(request.ociProcessJson)).toEqual({ ...ociSpec.process, terminal: false, args: ['cat', '/etc/hostname'] });
  });

  it('a terminal exec: terminal on, and the first size as consoleSize', () => {
    const request = execProcessRequest(record, {
      execId: 'e2',
      cmd: ['sh'],
      tty: true,
      stdin: true,
      consoleSize: { height: 40, width: 120 },
    });
    expect(request.tty).toBe(true);
    const process = JSON.parse(request.ociProcessJson);
    expect(process).toMatchObject({ terminal: true, args: ['sh'], consoleSize: { height: 40, width: 120 }, cwd: '/srv' });
  });

  it('leaves the stored spec as it was (each exec starts from the container process)', () => {
    const before = structuredClone(ociSpec);
    execOciProcess(record, { execId: 'e3', cmd: ['true'], tty: true, stdin: false, consoleSize: { height: 1, width: 2 } });
    expect(ociSpec).toEqual(before);
  });

  it('a container without a guest plan: only the command and the terminal', () => {
    expect(execOciProcess({ guest: null }, { execId: 'e4', cmd: ['ls'], tty: false, stdin: false })).toEqual({
      terminal: false,
      args: ['ls'],
    });
  });
});
