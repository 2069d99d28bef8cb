/**
 * kata-ts as CRI-O's `runtime_type = "vm"` handler, by contract: no CRI-O exists here, so this
 * test replays what CRI-O 1.28+ does (internal/oci/runtime_vm.go; test/helpers/crio-node.ts says
 * how) against the real shim binary and one real pod VM:
 *
 * - `start` for every container, the pause one included (CRI-O's command line and environment:
 *   no events address), the plain address on stdout, `<bundle>/address` written; the shim's log
 *   reaches CRI-O through `<bundle>/log`;
 * - the task API over ttrpc as CRI-O calls it: the sandbox task, containers on the mounted image
 *   CRI-O names by `root.path` with raw output in the FIFOs the test made, exits through Wait (no
 *   events service), Exec with its own FIFOs, CloseIO and ResizePty, Kill, State, Pids, Stats as the cgroup
 *   metrics CRI-O decodes, Checkpoint refused, Pause/Resume freezing a busy container, Delete then Shutdown per container;
 * - CRI-O's restore: a new connection from `<bundle>/address` finds the running container;
 * - an OOM kill: exit 137 and the `<bundle>/oom` file CRI-O looks for;
 * - the end: the sandbox killed, deleted, Shutdown: the shim exits, nothing of the pod is left
 *   (process, mount, cgroup, state dir, socket, the TAP in the pod's network namespace).
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openFifoSocket } from '../../../src/common/fifo.js';
import { decodeAny, jsonAnyOf, OCI_TYPE_URLS } from '../../../src/shim/proto.js';
import { TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { type ContainerBundle, type CrioNode, createCrioNode, crioId, type FifoReader, type TaskApi } from '../../helpers/crio-node.js';
import { processesMentioning } from '../../helpers/hypervisor-guest.js';
import { until } from '../../helpers/poll.js';
import { cgroupDirsUnder } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const BOOT_MS = scaledMs(240_000);
const LONG = scaledMs(120_000);

/** runtimeoptions.v1.Options{config_path} as CRI-O sends it in Create when runtime_config_path is set. */
const RUNTIME_OPTIONS = {
  type_url: 'runtimeoptions.v1.Options',
  value: Buffer.concat([Buffer.from([0x12, 25]), Buffer.from('/etc/kata-ts/config.json')]),
};

async function rpcError(p: Promise<unknown>): Promise<TtrpcStatusError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(TtrpcStatusError);
  return err as TtrpcStatusError;
}

describe("kata-ts under CRI-O's VM runtime contract (CRI-O replayed: the real shim binary, one pod VM)", () => {
  let node: CrioNode;
  let api: TaskApi;
  let address = '';
  let qemuPid = 0;
  let servePid = 0;

  beforeAll(async () => {
    node = await createCrioNode();
  }, LONG);

  afterAll(async () => {
    await node?.cleanup();
  }, LONG);

  /** CRI-O's CreateContainer + StartContainer for an app container, output FIFOs made and opened first. */
  async function createAndStart(c: ContainerBundle): Promise<{ stdout: FifoReader; stderr: FifoReader; pid: number }> {
    const started = await node.runShim('start', c.id, c.bundle);
    expect(started).toEqual({ code: 0, stdout: Buffer.from(address), stderr: '' });
    expect(readFileSync(path.join(c.bundle, 'address'), 'utf8')).toBe(address);
    const stdout = await node.fifo(`${c.id}-stdout`);
    const stderr = await node.fifo(`${c.id}-stderr`);
    const created = await api.call(
      'Create',
      'containerd.task.v2.CreateTaskRequest',
      { id: c.id, bundle: c.bundle, rootfs: [], stdout: stdout.path, stderr: stderr.path, options: RUNTIME_OPTIONS },
      'containerd.task.v2.CreateTaskResponse',
      LONG,
    );
    expect(created.pid).toBe(0);
    const { pid } = await api.call('Start', 'containerd.task.v2.StartRequest', { id: c.id }, 'containerd.task.v2.StartResponse', LONG);
    expect(pid).toBeGreaterThan(0);
    return { stdout, stderr, pid };
  }

  /** CRI-O's RemoveContainer: Delete, then Shutdown with the container's id (the shim stays while the pod holds tasks). */
  async function remove(id: string, exitStatus: number): Promise<void> {
    const deleted = await api.call('Delete', 'containerd.task.v2.DeleteRequest', { id }, 'containerd.task.v2.DeleteResponse', LONG);
    expect(deleted.exit_status).toBe(exitStatus);
    await api.empty('Shutdown', 'containerd.task.v2.ShutdownRequest', { id });
    expect((await rpcError(api.call('State', 'containerd.task.v2.StateRequest', { id }, 'containerd.task.v2.StateResponse'))).code).toBe(5);
  }

  const wait = (id: string, execId = '', timeoutMs = LONG) =>
    api.call('Wait', 'containerd.task.v2.WaitRequest', { id, exec_id: execId }, 'containerd.task.v2.WaitResponse', timeoutMs);
  const state = (id: string, execId = '') =>
    api.call('State', 'containerd.task.v2.StateRequest', { id, exec_id: execId }, 'containerd.task.v2.StateResponse');

  it(
    "start for the pause container (CRI-O's command line, no events address) prints the plain address and writes <bundle>/address; the sandbox task boots the pod VM in the pod's namespace and cgroup",
    async () => {
      const started = await node.runShim('start', node.sandboxId, node.sandboxBundle);
      address = `unix://${node.socketPath}`;
      expect(started).toEqual({ code: 0, stdout: Buffer.from(address), stderr: '' });
      expect(readFileSync(path.join(node.sandboxBundle, 'address'), 'utf8')).toBe(address);
      const info = JSON.parse(readFileSync(path.join(node.podStateDir, 'shim.json'), 'utf8')) as { pid: number; cgroupDriver: string };
      servePid = info.pid;
      expect(info.cgroupDriver).toBe('cgroupfs');
      api = await node.connect(readFileSync(path.join(node.sandboxBundle, 'address'), 'utf8'));
      // CRI-O makes FIFOs for the pause container too.
      const stdout = await node.fifo(`${node.sandboxId}-stdout`);
      const stderr = await node.fifo(`${node.sandboxId}-stderr`);
      const created = await api.call(
        'Create',
        'containerd.task.v2.CreateTaskRequest',
        { id: node.sandboxId, bundle: node.sandboxBundle, rootfs: [], stdout: stdout.path, stderr: stderr.path, options: RUNTIME_OPTIONS },
        'containerd.task.v2.CreateTaskResponse',
        BOOT_MS,
      );
      qemuPid = created.pid;
      expect(readFileSync(`/proc/${qemuPid}/cmdline`, 'utf8')).toMatch(/^qemu-system/);
      expect(readFileSync(`/proc/${qemuPid}/cgroup`, 'utf8')).toContain(`${node.cgroupParent}/`);
      const start = await api.call('Start', 'containerd.task.v2.StartRequest', { id: node.sandboxId }, 'containerd.task.v2.StartResponse');
      expect(start.pid).toBe(qemuPid);
      expect(await state(node.sandboxId)).toMatchObject({ status: 'RUNNING', pid: qemuPid, bundle: node.sandboxBundle });
      // IsContainerAlive's probe (Kill with signal 0) ends nothing.
      await api.empty('Kill', 'containerd.task.v2.KillRequest', { id: node.sandboxId, signal: 0 });
      expect((await state(node.sandboxId)).status).toBe('RUNNING');
      // The pod's eth0 now feeds the VM: a TAP wired into the namespace the test made.
      expect(await node.netns.exec('pod', ['ip', '-o', 'link', 'show'])).toContain('tap0_kata');
    },
    BOOT_MS + LONG,
  );

  it(
    "a container on CRI-O's mounted image: raw stdout and stderr in the FIFOs, EOF at its exit, Wait's status, State STOPPED; Delete and Shutdown",
    async () => {
      const c = await node.containerBundle({ name: 'echo', args: ['sh', '-c', 'echo hi; echo oops >&2; exit 5'] });
      const { stdout, stderr, pid } = await createAndStart(c);
      expect(existsSync(path.join(c.bundle, 'rootfs'))).toBe(false);
      expect((await wait(c.id)).exit_status).toBe(5);
      await Promise.all([stdout.ended, stderr.ended]);
      expect([stdout.text(), stderr.text()]).toEqual(['hi\n', 'oops\n']);
      expect(await state(c.id)).toMatchObject({ status: 'STOPPED', exit_status: 5, pid, stdout: stdout.path, stderr: stderr.path });
      expect(existsSync(path.join(c.bundle, 'oom'))).toBe(false);
      await remove(c.id, 5);
    },
    LONG * 2,
  );

  it(
    'a running container: State, Pids, the probe, Stats as cgroup metrics CRI-O decodes; Exec with its own FIFOs (stdin + CloseIO, a terminal + ResizePty); Checkpoint refused; a restored connection; SIGKILL -> 137',
    async () => {
      const c = await node.containerBundle({ name: 'sleeper', args: ['sleep', '1000'] });
      const { pid } = await createAndStart(c);
      // The VMM's pid, as Kata reports: a guest pid would name an unrelated host process.
      expect(pid).toBe(qemuPid);
      expect(await state(c.id)).toMatchObject({ status: 'RUNNING', pid });
      const pids = await api.call('Pids', 'containerd.task.v2.PidsRequest', { id: c.id }, 'containerd.task.v2.PidsResponse');
      expect(pids.processes.map((p) => p.pid)).toContain(pid);
      await api.empty('Kill', 'containerd.task.v2.KillRequest', { id: c.id, signal: 0 });

      // Stats: CRI-O reads v1 (or v2) metrics through pointers it never checks for nil.
      const metrics = await until('cpu usage in Stats', async (note) => {
        const { stats } = await api.call('Stats', 'containerd.task.v2.StatsRequest', { id: c.id }, 'containerd.task.v2.StatsResponse');
        note(stats?.type_url);
        if (stats === null) return undefined;
        if (stats.type_url === 'io.containerd.cgroups.v2.Metrics') {
          const m = decodeAny(stats, 'io.containerd.cgroups.v2.Metrics');
          expect([m.pids, m.cpu, m.memory].every((x) => x !== null)).toBe(true);
          return BigInt(m.cpu!.usage_usec) > 0n ? { cpu: BigInt(m.cpu!.usage_usec), memory: BigInt(m.memory!.usage) } : undefined;
        }
        const m = decodeAny(stats, 'io.containerd.cgroups.v1.Metrics');
        const m1 = m.memory!;
        expect([m.pids, m.cpu?.usage, m.cpu?.throttling, m1.usage, m1.swap, m1.kernel, m1.kernel_tcp].every((x) => x !== null)).toBe(true);
        return BigInt(m.cpu!.usage!.total) > 0n ? { cpu: BigInt(m.cpu!.usage!.total), memory: BigInt(m1.usage!.usage) } : undefined;
      });
      expect(metrics.cpu).toBeGreaterThan(0n);
      expect(metrics.memory).toBeGreaterThan(0n);

      // ExecSync as CRI-O does it: the container's process with other args, its own FIFOs.
      const execId = crioId();
      const out = await node.fifo(`${execId}-stdout`);
      const err = await node.fifo(`${execId}-stderr`);
      await api.empty('Exec', 'containerd.task.v2.ExecProcessRequest', {
        id: c.id,
        exec_id: execId,
        stdout: out.path,
        stderr: err.path,
        spec: jsonAnyOf(
          OCI_TYPE_URLS.process,
          node.execProcess(c, ['sh', '-c', 'hostname; ip -4 -o addr show dev eth0; echo to-stderr >&2; exit 3']),
        ),
      });
      const execStart = await api.call(
        'Start',
        'containerd.task.v2.StartRequest',
        { id: c.id, exec_id: execId },
        'containerd.task.v2.StartResponse',
        LONG,
      );
      expect(execStart.pid).toBe(qemuPid);
      expect((await wait(c.id, execId)).exit_status).toBe(3);
      await Promise.all([out.ended, err.ended]);
      expect(out.text()).toMatch(new RegExp(`^crio-pod\\n.*inet ${node.netns.podIp.replaceAll('.', '\\.')}/24`, 's'));
      expect(err.text()).toBe('to-stderr\n');
      expect(await state(c.id, execId)).toMatchObject({ status: 'STOPPED', exit_status: 3 });
      await api.call('Delete', 'containerd.task.v2.DeleteRequest', { id: c.id, exec_id: execId }, 'containerd.task.v2.DeleteResponse');

      // An exec with stdin (CRI-O's streaming Exec): bytes in through the FIFO, CloseIO ends it.
      const catId = crioId();
      const stdinPath = await node.makeFifo(`${catId}-stdin`);
      const catOut = await node.fifo(`${catId}-stdout`);
      await api.empty('Exec', 'containerd.task.v2.ExecProcessRequest', {
        id: c.id,
        exec_id: catId,
        stdin: stdinPath,
        stdout: catOut.path,
        spec: jsonAnyOf(OCI_TYPE_URLS.process, node.execProcess(c, ['cat'])),
      });
      const stdin = await openFifoSocket(stdinPath, 'write');
      await api.call('Start', 'containerd.task.v2.StartRequest', { id: c.id, exec_id: catId }, 'containerd.task.v2.StartResponse', LONG);
      await new Promise<void>((resolve) => stdin.write('ping\n', () => resolve()));
      await until('cat echoes its stdin', async () => (catOut.text() === 'ping\n' ? true : undefined));
      await api.empty('CloseIO', 'containerd.task.v2.CloseIORequest', { id: c.id, exec_id: catId, stdin: true });
      expect((await wait(c.id, catId)).exit_status).toBe(0);
      stdin.destroy();
      await api.call('Delete', 'containerd.task.v2.DeleteRequest', { id: c.id, exec_id: catId }, 'containerd.task.v2.DeleteResponse');

      // A terminal exec (kubectl exec -it): one output FIFO, the size CRI-O's ResizePty sets.
      const ttyId = crioId();
      const ttyIn = await node.makeFifo(`${ttyId}-stdin`);
      const ttyOut = await node.fifo(`${ttyId}-stdout`);
      await api.empty('Exec', 'containerd.task.v2.ExecProcessRequest', {
        id: c.id,
        exec_id: ttyId,
        terminal: true,
        stdin: ttyIn,
        stdout: ttyOut.path,
        spec: jsonAnyOf(OCI_TYPE_URLS.process, { ...node.execProcess(c, ['sh', '-c', 'read line; stty size']), terminal: true }),
      });
      const ttyStdin = await openFifoSocket(ttyIn, 'write');
      await api.call('Start', 'containerd.task.v2.StartRequest', { id: c.id, exec_id: ttyId }, 'containerd.task.v2.StartResponse', LONG);
      await api.empty('ResizePty', 'containerd.task.v2.ResizePtyRequest', { id: c.id, exec_id: ttyId, width: 123, height: 45 });
      await new Promise<void>((resolve) => ttyStdin.write('go\n', () => resolve()));
      expect((await wait(c.id, ttyId)).exit_status).toBe(0);
      ttyStdin.destroy();
      expect(ttyOut.text()).toContain('45 123\r\n');
      await api.call('Delete', 'containerd.task.v2.DeleteRequest', { id: c.id, exec_id: ttyId }, 'containerd.task.v2.DeleteResponse');

      const refused = await rpcError(api.empty('Checkpoint', 'containerd.task.v2.CheckpointTaskRequest', { id: c.id }));
      expect(refused.code).toBe(12);
      expect(refused.message).toMatch(/not supported/);

      // CRI-O restarted: no connection of its own; it reads <bundle>/address and asks State.
      await api.close();
      api = await node.connect(readFileSync(path.join(c.bundle, 'address'), 'utf8'));
      expect(await state(c.id)).toMatchObject({ status: 'RUNNING', pid });

      const waited = wait(c.id);
      await api.empty('Kill', 'containerd.task.v2.KillRequest', { id: c.id, signal: 9, all: true });
      expect((await waited).exit_status).toBe(137);
      expect(await state(c.id)).toMatchObject({ status: 'STOPPED', exit_status: 137 });
      expect(existsSync(path.join(c.bundle, 'oom'))).toBe(false);
      await remove(c.id, 137);
    },
    LONG * 4,
  );

  it(
    'Pause freezes a busy container in the guest (its CPU time stops, State PAUSED) and Resume thaws it; both idempotent',
    async () => {
      const c = await node.containerBundle({ name: 'busy', args: ['sh', '-c', 'while :; do :; done'] });
      await createAndStart(c);
      /** The container's CPU time (µs) as Stats reports it (the guest cgroup's cpu.stat). */
      const cpuUsec = async (): Promise<bigint> => {
        const { stats } = await api.call('Stats', 'containerd.task.v2.StatsRequest', { id: c.id }, 'containerd.task.v2.StatsResponse');
        if (stats?.type_url === 'io.containerd.cgroups.v2.Metrics')
          return BigInt(decodeAny(stats, 'io.containerd.cgroups.v2.Metrics').cpu!.usage_usec);
        return BigInt(decodeAny(stats!, 'io.containerd.cgroups.v1.Metrics').cpu!.usage!.total) / 1000n;
      };
      await until('the busy loop to use CPU', async () => ((await cpuUsec()) > 0n ? true : undefined));
      await api.empty('Pause', 'containerd.task.v2.PauseRequest', { id: c.id });
      await api.empty('Pause', 'containerd.task.v2.PauseRequest', { id: c.id });
      expect(await state(c.id)).toMatchObject({ status: 'PAUSED' });
      // Frozen: not one more microsecond of CPU across two reads a second apart (a running busy
      // loop gains about a second's worth in that time).
      const frozenAt = await cpuUsec();
      await new Promise((r) => setTimeout(r, 1000));
      expect(await cpuUsec()).toBe(frozenAt);
      await api.empty('Resume', 'containerd.task.v2.ResumeRequest', { id: c.id });
      await api.empty('Resume', 'containerd.task.v2.ResumeRequest', { id: c.id });
      expect(await state(c.id)).toMatchObject({ status: 'RUNNING' });
      await until('the busy loop to use CPU again', async () => ((await cpuUsec()) > frozenAt ? true : undefined));
      const waited = wait(c.id);
      await api.empty('Kill', 'containerd.task.v2.KillRequest', { id: c.id, signal: 9 });
      expect((await waited).exit_status).toBe(137);
      await remove(c.id, 137);
    },
    LONG * 2,
  );

  it(
    'a container over its memory limit: the guest OOM-kills it, Wait answers 137 and <bundle>/oom exists (how CRI-O learns OOMKilled)',
    async () => {
      const c = await node.containerBundle({ name: 'hog', args: ['tail', '/dev/zero'], memoryLimitBytes: 32 * 1024 * 1024 });
      await createAndStart(c);
      expect((await wait(c.id)).exit_status).toBe(137);
      expect(existsSync(path.join(c.bundle, 'oom'))).toBe(true);
      expect(await state(c.id)).toMatchObject({ status: 'STOPPED', exit_status: 137 });
      await remove(c.id, 137);
    },
    LONG * 2,
  );

  it(
    "StopPodSandbox and RemovePodSandbox: the sandbox killed (137 through Wait), deleted, Shutdown: the shim exits; no process, mount, cgroup, state, socket or TAP is left; the shim's log reached CRI-O's FIFO with no event retries",
    async () => {
      const waited = wait(node.sandboxId);
      await api.empty('Kill', 'containerd.task.v2.KillRequest', { id: node.sandboxId, signal: 15 }, LONG);
      expect((await waited).exit_status).toBe(137);
      expect((await state(node.sandboxId)).status).toBe('STOPPED');
      await api.call('Delete', 'containerd.task.v2.DeleteRequest', { id: node.sandboxId }, 'containerd.task.v2.DeleteResponse', LONG);
      await api.empty('Shutdown', 'containerd.task.v2.ShutdownRequest', { id: node.sandboxId });
      await until('the shim to exit', async (note) => {
        const alive = existsSync(`/proc/${servePid}`) && !readFileSync(`/proc/${servePid}/stat`, 'utf8').includes(') Z ');
        note(alive);
        return alive ? undefined : true;
      });
      expect(processesMentioning(node.stateRoot)).toEqual([]);
      expect(existsSync(node.socketPath)).toBe(false);
      expect(existsSync(node.podStateDir)).toBe(false);
      expect(await node.mounts()).toEqual([]);
      const cgroups = (await cgroupDirsUnder(node.cgroupRoot)).filter((d) => d.includes(node.sandboxId.slice(0, 16)) || /crio-/.test(d));
      expect(cgroups).toEqual([]);
      expect((await node.netns.exec('pod', ['ip', '-o', 'link', 'show'])).includes('tap0_kata')).toBe(false);
      expect(await node.netns.exec('pod', ['ip', '-4', '-o', 'addr', 'show', 'dev', 'eth0'])).toContain(`inet ${node.netns.podIp}/24`);
      const log = node.shimLog();
      expect(log.some((l) => l.includes('shim serving'))).toBe(true);
      expect(log.filter((l) => l.includes('TTRPC_ADDRESS is empty'))).toHaveLength(1);
      expect(log.filter((l) => l.includes('event not forwarded'))).toEqual([]);
      expect(existsSync(path.join(node.stateRoot, 's')) ? readdirSync(path.join(node.stateRoot, 's')) : []).toEqual([]);
    },
    LONG * 2,
  );
});
