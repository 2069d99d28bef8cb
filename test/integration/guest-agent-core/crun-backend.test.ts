/**
 * The agent server's ContainerBackend (CrunBackend) with the real crun on this host, through the
 * agent API's shapes: JSON spec text in, pipes out, exit statuses, list, exec lifecycle, events.
 * Same safety as containers.test.ts (cgroups disabled, private mount namespace).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BackendEvent } from '../../../guest/agent/backend.js';
import { Containers } from '../../../guest/agent/containers/containers.js';
import { CrunBackend } from '../../../guest/agent/containers/crun-backend.js';
import { GUEST_ROOTS } from '../../../guest/agent/containers/guest-facts.js';
import { HAVE_CRUN, type HostCrun, startHostCrun, testSpec } from './host-crun.js';

async function readAll(stream: NodeJS.ReadableStream | undefined): Promise<string> {
  if (!stream) return '';
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(Buffer.from(c as Buffer));
  return Buffer.concat(parts).toString('utf8');
}

describe.skipIf(!HAVE_CRUN)('CrunBackend with real crun (host, cgroups disabled)', () => {
  let host: HostCrun;
  let backend: CrunBackend;
  const events: BackendEvent[] = [];

  beforeAll(async () => {
    host = await startHostCrun();
    const containers = new Containers({
      runtime: { command: host.command, stateDir: host.stateDir, cgroupManager: 'disabled' },
      bundlesDir: host.bundlesDir,
      reaperPath: host.reaperPath,
      cgroupRoot: '/nonexistent-cgroup-root',
      // These tests read the processes' pipes; the spool path is tested through the agent service.
      spoolOutput: false,
    });
    backend = new CrunBackend(containers, { roots: GUEST_ROOTS });
    backend.onEvent((e) => events.push(e));
  });

  afterAll(async () => {
    if (backend) for (const c of await backend.listContainers([])) await backend.deleteContainer(c.containerId, true);
    host?.close();
  });

  it('creates from JSON text, starts, execs and reports exits, list and events', async () => {
    const created = await backend.createContainer({
      containerId: 'b1',
      ociConfigJson: JSON.stringify(testSpec(['sh', '-c', 'echo started; sleep 1000'])),
      rootfsPath: host.rootfs,
      stdio: 'STDIO_MODE_PIPES',
      stdin: false,
      stdinOnce: false,
      devices: [],
      secrets: [],
    });
    expect(created.pid).toBeGreaterThan(0);
    expect((await backend.listContainers(['b1']))[0]).toMatchObject({ status: 'CONTAINER_STATUS_CREATED', exit: null });
    const { startedAt } = await backend.startContainer('b1');
    expect(startedAt.seconds).toBeGreaterThan(0);

    const exec = await backend.execProcess({
      containerId: 'b1',
      execId: 'x1',
      ociProcessJson: JSON.stringify({ args: ['sh', '-c', 'echo from-exec >&2; exit 4'], cwd: '/', env: ['PATH=/bin'] }),
      tty: false,
      stdin: false,
    });
    expect(await readAll(exec.stdio.stderr)).toBe('from-exec\n');
    expect(await backend.waitProcess('b1', 'x1', new AbortController().signal)).toMatchObject({ exitCode: 4, signal: 0 });
    await backend.deleteProcess('b1', 'x1');
    await expect(backend.waitProcess('b1', 'x1', new AbortController().signal)).rejects.toMatchObject({ kind: 'not_found' });

    // A waiter can give up without affecting the container.
    const abort = new AbortController();
    const waiting = backend.waitContainer('b1', abort.signal);
    abort.abort(new Error('caller went away'));
    await expect(waiting).rejects.toThrow('caller went away');

    await expect(backend.deleteContainer('b1', false)).rejects.toMatchObject({ reason: 'CONTAINER_RUNNING' });
    // all=false: `crun kill --all` finds processes through the container's cgroup, and cgroups are
    // disabled here (it succeeds and kills nothing); in the guest it works through cgroupfs.
    await backend.signalContainer('b1', 9, false);
    expect(await backend.waitContainer('b1', new AbortController().signal)).toMatchObject({ exitCode: 137, signal: 9, oomKilled: false });
    expect(await readAll(created.stdio.stdout)).toBe('started\n');
    expect((await backend.listContainers([]))[0]).toMatchObject({ status: 'CONTAINER_STATUS_STOPPED', exit: { exitCode: 137 } });
    await backend.deleteContainer('b1', false);
    expect(await backend.listContainers([])).toEqual([]);
    // Each entity's events are in order; an exec's exit report and its container's are not ordered
    // against each other (a loaded machine delivered the container's first once).
    const kinds = events.map((e) => e.kind);
    expect(kinds[0]).toBe('container-started');
    expect([...kinds].sort()).toEqual(['container-exited', 'container-started', 'process-exited']);
  });

  it('refuses spec text that is not a JSON object', async () => {
    await expect(
      backend.createContainer({
        containerId: 'b2',
        ociConfigJson: '[1]',
        rootfsPath: host.rootfs,
        stdio: 'STDIO_MODE_PIPES',
        stdin: false,
        stdinOnce: false,
        devices: [],
        secrets: [],
      }),
    ).rejects.toMatchObject({ kind: 'invalid', reason: 'AGENT_JSON_INVALID' });
  });
});
