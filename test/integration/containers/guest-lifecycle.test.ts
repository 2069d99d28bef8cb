/**
 * The container layer's guest half (create + start, log pump, exit watch, stop, ExecSync, resume
 * after a daemon restart, ReopenContainerLog) against the REAL guest agent (AgentService with the
 * crun backend) and the real crun and reaper, run on this host as
 * test/integration/guest-agent-core/host-crun.ts does it safely (cgroups disabled, private mount
 * namespace), reached through the real channel over a unix socket with the real AgentClient.
 * No VM: the pod-VM tests of the CRI surface are in cri-flow.test.ts.
 */

import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Containers } from '../../../guest/agent/containers/containers.js';
import { CrunBackend } from '../../../guest/agent/containers/crun-backend.js';
import { GUEST_ROOTS } from '../../../guest/agent/containers/guest-facts.js';
import { AgentService } from '../../../guest/agent/server.js';
import { AgentClient } from '../../../src/agent-client/index.js';
import { serveDuplex } from '../../../src/channel/index.js';
import type { ExitStatus } from '../../../src/generated/agent/agent.js';
import type { OciSpec } from '../../../src/oci/index.js';
import { createAndStart, execSync, exitReason, stopInGuest } from '../../../src/runtime/container/guest-ops.js';
import type { ContainerRecord } from '../../../src/runtime/container/record.js';
import { ContainerTasks } from '../../../src/runtime/container/tasks.js';
import { until as pollUntil } from '../../helpers/poll.js';
import { HAVE_CRUN, type HostCrun, startHostCrun, testSpec } from '../guest-agent-core/host-crun.js';

const logger = pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' });

function record(id: string, args: string[], opts: { stopSignal?: string; logDir: string; tty?: boolean }, rootfs: string): ContainerRecord {
  return {
    id,
    sandboxId: 's'.repeat(64),
    state: 'CONTAINER_CREATED',
    createdAtNs: '1',
    startedAtNs: '0',
    finishedAtNs: '0',
    exitCode: 0,
    reason: '',
    message: '',
    metadata: { name: id, attempt: 0 },
    image: { requested: 'busybox', id: 'x', ref: 'x' },
    labels: {},
    annotations: {},
    logPath: path.join(opts.logDir, `${id}.log`),
    rootfs,
    rootfsOwner: 'caller',
    rootfsOverlay: null,
    stdio: { kind: 'cri-log' },
    pid: 0,
    spec: { tty: opts.tty ?? false, stdin: false, stdin_once: false } as ContainerRecord['spec'],
    demand: { cpuMillicores: 0, memoryBytes: 0, hugepages: {} },
    devices: [],
    guest: {
      ociSpec: testSpec(args, { tty: opts.tty }) as unknown as OciSpec,
      guestDevices: [],
      stopSignal: opts.stopSignal ?? 'SIGTERM',
      rootfsGuestPath: rootfs,
      hostDir: '/nonexistent',
      bindMounts: [],
    },
  };
}

/** Parse CRI log records: [stream, tag, text]. */
async function logRecords(file: string): Promise<Array<[string, string, string]>> {
  const text = await fsp.readFile(file, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [, stream, tag, ...rest] = l.split(' ');
      return [stream!, tag!, rest.join(' ')];
    });
}

const until = <T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> =>
  pollUntil(what, () => fn(), timeoutMs, 50);

describe.skipIf(!HAVE_CRUN)('containers through the real guest agent and crun (host, no VM)', () => {
  let host: HostCrun;
  let server: net.Server;
  let socketPath: string;
  let agent: AgentClient;
  let dir: string;
  const exits = new Map<string, ExitStatus>();
  let tasks: ContainerTasks;

  const newTasks = () =>
    new ContainerTasks({
      stateDir: dir,
      logger,
      onExit: async (id, exit) => void exits.set(id, exit),
      onLost: async () => undefined,
      onOom: async () => undefined,
    });

  beforeAll(async () => {
    host = await startHostCrun();
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-w3-'));
    socketPath = path.join(dir, 'agent.sock');
    await startAgent();
    agent = await AgentClient.connect({ socketPath, logger, hostVersion: 'test' }, 10_000);
    tasks = newTasks();
  });

  /** An agent (core + service) on `socketPath`; a second call stands for the restarted agent. */
  async function startAgent(): Promise<void> {
    const containers = new Containers({
      runtime: { command: host.command, stateDir: host.stateDir, cgroupManager: 'disabled' },
      bundlesDir: host.bundlesDir,
      reaperPath: host.reaperPath,
      cgroupRoot: '/nonexistent-cgroup-root',
    });
    await containers.recover(50);
    const service = new AgentService({ backend: new CrunBackend(containers, { roots: GUEST_ROOTS }), agentVersion: 'test', logger });
    server = net.createServer((socket) => serveDuplex(socket, (session) => service.attach(session)));
    await new Promise<void>((r) => server.listen(socketPath, r));
  }

  afterAll(async () => {
    await tasks?.detachAll();
    if (agent) {
      for (const c of await agent.listContainers([], { timeoutMs: 5000 }).catch(() => [])) {
        await agent.deleteContainer(c.containerId, true, { timeoutMs: 10_000 }).catch(() => undefined);
      }
      agent.close();
    }
    server?.close();
    host?.close();
    if (dir) await fsp.rm(dir, { recursive: true, force: true });
  });

  it('exit 0 and exit 3: output in the CRI log with partial lines, reasons Completed and Error', async () => {
    const ok = record('c-ok', ['sh', '-c', 'echo hello; printf "no newline"'], { logDir: dir }, host.rootfs);
    const bad = record('c-bad', ['sh', '-c', 'echo oops >&2; exit 3'], { logDir: dir }, host.rootfs);
    for (const r of [ok, bad]) {
      expect(BigInt((await createAndStart(agent, r)).startedAtNs)).toBeGreaterThan(0n);
      tasks.attach(r, agent);
    }
    await tasks.exited(ok.id);
    await tasks.exited(bad.id);
    expect(exitReason(exits.get(ok.id)!)).toEqual({ reason: 'Completed', message: '' });
    expect(exits.get(bad.id)!.exitCode).toBe(3);
    expect(exitReason(exits.get(bad.id)!).reason).toBe('Error');
    await tasks.drain(ok.id);
    await tasks.drain(bad.id);
    expect(await logRecords(ok.logPath)).toEqual([
      ['stdout', 'F', 'hello'],
      ['stdout', 'P', 'no newline'],
    ]);
    expect(await logRecords(bad.logPath)).toEqual([['stderr', 'F', 'oops']]);
  });

  it('StopContainer: the stop signal is ignored by a shell as init, SIGKILL after the timeout (137)', async () => {
    const r = record('c-stop', ['sleep', '1000'], { logDir: dir }, host.rootfs);
    await createAndStart(agent, r);
    tasks.attach(r, agent);
    await stopInGuest(agent, r, 500, tasks.exited(r.id));
    expect(exits.get(r.id)).toMatchObject({ exitCode: 137, signal: 9 });
    // Idempotent: stopping a stopped container succeeds.
    await stopInGuest(agent, r, 500, tasks.exited(r.id));
  });

  it('StopContainer with a stop signal the process honours exits before the timeout', async () => {
    const r = record('c-term', ['sh', '-c', 'trap "echo bye; exit 0" TERM; while true; do sleep 0.1; done'], { logDir: dir }, host.rootfs);
    await createAndStart(agent, r);
    tasks.attach(r, agent);
    // Time for the shell to set its trap (a signal before that would kill it: exit 143).
    await new Promise((res) => setTimeout(res, 500));
    await stopInGuest(agent, r, 20_000, tasks.exited(r.id));
    expect(exits.get(r.id)).toMatchObject({ exitCode: 0, signal: 0 });
    await tasks.drain(r.id);
    expect(await logRecords(r.logPath)).toEqual([['stdout', 'F', 'bye']]);
  });

  it('ExecSync: output, exit code, and a timeout that kills the process', async () => {
    const r = record('c-exec', ['sleep', '1000'], { logDir: dir }, host.rootfs);
    await createAndStart(agent, r);
    tasks.attach(r, agent);
    const res = await execSync(agent, r, ['sh', '-c', 'echo out; echo err >&2; exit 2'], 10_000);
    expect([res.stdout.toString(), res.stderr.toString(), res.exitCode]).toEqual(['out\n', 'err\n', 2]);
    const bounded = await execSync(agent, r, ['sh', '-c', 'yes | head -c 5000'], 10_000, 1000);
    expect(bounded.stdout.length).toBeLessThan(1100);
    expect(bounded.stdout.toString()).toContain('truncated');
    await expect(execSync(agent, r, ['sleep', '4242'], 500)).rejects.toMatchObject({ kind: 'timeout', reason: 'CONTAINER_EXEC_TIMEOUT' });
    const after = await execSync(agent, r, ['sh', '-c', 'cat /proc/[0-9]*/cmdline'], 10_000);
    expect(after.stdout.toString()).not.toContain('4242');
    await stopInGuest(agent, r, 0, tasks.exited(r.id));
  });

  it('a daemon restart in the middle: the log continues with no line lost or repeated; ReopenContainerLog', async () => {
    const script = 'i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); sleep 0.01; done';
    const r = record('c-restart', ['sh', '-c', script], { logDir: dir }, host.rootfs);
    await createAndStart(agent, r);
    tasks.attach(r, agent);
    await until('some lines', async () => ((await logRecords(r.logPath)).length > 30 ? true : undefined));
    // "Daemon dies": the tasks stop, the client goes; a new client and new tasks resume.
    await tasks.detachAll();
    agent.close();
    agent = await AgentClient.connect({ socketPath, logger, hostVersion: 'test' }, 10_000);
    tasks = newTasks();
    tasks.attach(r, agent);
    await until('more lines', async () => ((await logRecords(r.logPath)).length > 100 ? true : undefined));
    const rotated = `${r.logPath}.1`;
    await fsp.rename(r.logPath, rotated);
    expect(await tasks.reopenLog(r.id)).toBe(true);
    await tasks.exited(r.id);
    await tasks.drain(r.id);
    const lines = [...(await logRecords(rotated)), ...(await logRecords(r.logPath))].map(([s, t, text]) => `${s} ${t} ${text}`);
    expect(lines).toEqual(Array.from({ length: 300 }, (_, i) => `stdout F line-${i}`));
    expect((await logRecords(r.logPath)).length).toBeGreaterThan(0);
  });

  it('unread output is bounded in the guest: the reaper stops at its spool limit, the container blocks, then every line arrives', async () => {
    const r = record(
      'c-bound',
      ['sh', '-c', 'yes abcdefghijklmnopqrstuvwxyz0123456789 | head -n 60000; echo done'],
      { logDir: dir },
      host.rootfs,
    );
    await createAndStart(agent, r);
    const spool = path.join(host.bundlesDir, r.id, 'output.spool');
    // Nobody reads: the spool grows to its 1 MiB bound and stops there.
    await until('a full spool', async () => ((await fsp.stat(spool)).size >= 1024 * 1024 ? true : undefined));
    await new Promise((res) => setTimeout(res, 500));
    expect((await fsp.stat(spool)).size).toBeLessThan(1024 * 1024 + 64 * 1024);
    expect((await agent.listContainers([r.id], { timeoutMs: 5000 }))[0]!.status).toBe('CONTAINER_STATUS_RUNNING');
    tasks.attach(r, agent);
    await tasks.exited(r.id);
    await tasks.drain(r.id);
    const lines = await logRecords(r.logPath);
    expect(lines).toHaveLength(60_001);
    expect(lines.every(([, , text], i) => text === (i < 60_000 ? 'abcdefghijklmnopqrstuvwxyz0123456789' : 'done'))).toBe(true);
    // Acknowledged output is released as it goes: the file keeps its size, not all its blocks.
    const st = await fsp.stat(spool);
    expect(st.blocks * 512).toBeLessThan(st.size / 2);
  });

  it('an agent restart in the middle: the output continues from the reaper spool with nothing lost or repeated; exec works', async () => {
    const script = 'i=0; while [ $i -lt 300 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); sleep 0.01; done; sleep 1000';
    const r = record('c-agent', ['sh', '-c', script], { logDir: dir }, host.rootfs);
    await createAndStart(agent, r);
    tasks.attach(r, agent);
    await until('some lines', async () => ((await logRecords(r.logPath)).length > 60 ? true : undefined));
    // "The agent dies": the host loses its session, the agent's server and journals go away;
    // the container keeps writing into the reaper's spool meanwhile.
    await tasks.detachAll();
    agent.close();
    await new Promise<void>((res) => server.close(() => res()));
    await new Promise((res) => setTimeout(res, 1000));
    await startAgent();
    agent = await AgentClient.connect({ socketPath, logger, hostVersion: 'test' }, 10_000);
    tasks = newTasks();
    tasks.attach(r, agent);
    await until('every line', async () => ((await logRecords(r.logPath)).length >= 600 ? true : undefined));
    const lines = (await logRecords(r.logPath)).map(([st, t, text]) => `${st} ${t} ${text}`);
    expect(lines.filter((l) => l.startsWith('stdout'))).toEqual(Array.from({ length: 300 }, (_, i) => `stdout F line-${i}`));
    expect(lines.filter((l) => l.startsWith('stderr'))).toEqual(Array.from({ length: 300 }, (_, i) => `stderr F err-${i}`));
    const res = await execSync(agent, r, ['echo', 'after agent restart'], 10_000);
    expect(res.stdout.toString()).toBe('after agent restart\n');
    await stopInGuest(agent, r, 0, tasks.exited(r.id));
    expect(exits.get(r.id)).toMatchObject({ exitCode: 137 });
  });
});
