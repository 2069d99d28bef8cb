/**
 * The guest agent's container core with the real crun and the real reaper, on this host (see
 * host-crun.ts for why that is safe: no cgroup is created or written, crun runs in a private
 * mount namespace). Exit codes, signals, exec with timeout, pipes with backpressure, offsets and
 * resume, stdin, tty. OOM and stats need the guest's cgroup2 (unit tests read fixture trees).
 */
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ProcessHandle } from '../../../guest/agent/containers/containers.js';
import { Containers } from '../../../guest/agent/containers/containers.js';
import { ProcessOutput } from '../../../guest/agent/containers/output.js';
import type { OutputChunk } from '../../../guest/agent/containers/types.js';
import { HAVE_CRUN, type HostCrun, startHostCrun, testSpec } from './host-crun.js';

/** The output of a process through the bounded window the agent's server may use (64 KiB here). */
function outputOf(handle: ProcessHandle): ProcessOutput {
  return new ProcessOutput({ stdout: handle.stdio.stdout, stderr: handle.stdio.stderr }, 64 * 1024);
}

async function collect(output: ProcessOutput): Promise<{ stdout: string; stderr: string; chunks: OutputChunk[] }> {
  const chunks: OutputChunk[] = [];
  for await (const c of output.chunks({ autoAck: true })) chunks.push(c);
  const text = (s: string) => Buffer.concat(chunks.filter((c) => c.stream === s).map((c) => c.data)).toString('utf8');
  return { stdout: text('stdout'), stderr: text('stderr'), chunks };
}

describe.skipIf(!HAVE_CRUN)('guest agent container core with real crun (host, cgroups disabled)', () => {
  let host: HostCrun;
  let containers: Containers;
  let n = 0;
  const nextId = () => `c${++n}`;
  const pipes = { tty: false, stdin: false };

  beforeAll(async () => {
    host = await startHostCrun();
    containers = new Containers({
      runtime: { command: host.command, stateDir: host.stateDir, cgroupManager: 'disabled' },
      bundlesDir: host.bundlesDir,
      reaperPath: host.reaperPath,
      cgroupRoot: '/nonexistent-cgroup-root',
      // These tests read the processes' pipes; the spool path is tested through the agent service.
      spoolOutput: false,
    });
  });

  afterAll(async () => {
    if (containers) for (const c of containers.list()) await containers.delete(c.id);
    host?.close();
  });

  it('reports exit 3 with both streams in order and moves created -> running -> stopped', async () => {
    const id = nextId();
    const created = await containers.create({
      id,
      spec: testSpec(['sh', '-c', 'echo out; echo err >&2; exit 3']),
      rootfsPath: host.rootfs,
      stdio: pipes,
    });
    expect(created.status).toBe('created');
    expect(created.pid).toBeGreaterThan(0);
    expect((await containers.start(id)).status).not.toBe('created');
    const exit = await containers.wait(id);
    expect(exit).toMatchObject({ exitCode: 3, oomKilled: false });
    expect(exit.signal).toBeUndefined();
    const out = await collect(outputOf(containers.process(id)));
    expect(out.stdout).toBe('out\n');
    expect(out.stderr).toBe('err\n');
    expect(containers.state(id).status).toBe('stopped');
    await containers.delete(id);
    expect(containers.list().map((c) => c.id)).not.toContain(id);
  });

  it('reports exit 0, and 137 with signal 9 for a container killed by SIGKILL', async () => {
    const ok = nextId();
    await containers.create({ id: ok, spec: testSpec(['true']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(ok);
    expect((await containers.wait(ok)).exitCode).toBe(0);

    const killed = nextId();
    await containers.create({ id: killed, spec: testSpec(['sleep', '1000']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(killed);
    await containers.signal(killed, 9, false);
    expect(await containers.wait(killed)).toMatchObject({ exitCode: 137, signal: 9 });
    // A signal to a stopped container is a no-op, as StopContainer's idempotence needs.
    await containers.signal(killed, 9, false);
    await containers.delete(ok);
    await containers.delete(killed);
    await containers.delete(killed);
  });

  it('delete --force of a running container kills it and removes its bundle', async () => {
    const id = nextId();
    await containers.create({ id, spec: testSpec(['sleep', '1000']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(id);
    await containers.delete(id);
    expect(existsSync(`${host.bundlesDir}/${id}`)).toBe(false);
  });

  it('refuses a container whose executable does not exist, leaving nothing behind', async () => {
    const id = nextId();
    await expect(
      containers.create({ id, spec: testSpec(['/no/such/binary']), rootfsPath: host.rootfs, stdio: pipes }),
    ).rejects.toMatchObject({
      kind: 'precondition',
      reason: 'RUNTIME_PROCESS_NOT_RUNNABLE',
      message: expect.stringContaining('/no/such/binary'),
    });
    expect(existsSync(`${host.bundlesDir}/${id}`)).toBe(false);
    expect(containers.list().map((c) => c.id)).not.toContain(id);
  });

  it('passes stdin through and ends it on close', async () => {
    const id = nextId();
    await containers.create({ id, spec: testSpec(['cat']), rootfsPath: host.rootfs, stdio: { tty: false, stdin: true } });
    await containers.start(id);
    const handle = containers.process(id);
    const stdin = handle.stdio.stdin;
    const output = outputOf(handle);
    stdin!.end('hello through stdin\n');
    expect((await collect(output)).stdout).toBe('hello through stdin\n');
    expect((await containers.wait(id)).exitCode).toBe(0);
    await containers.delete(id);
  });

  it('throttles a container whose output is not read, then delivers every byte with contiguous offsets', async () => {
    const id = nextId();
    const total = 4 * 1024 * 1024;
    await containers.create({ id, spec: testSpec(['head', '-c', String(total), '/dev/zero']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(id);
    const output = outputOf(containers.process(id));
    // Nobody reads: the reader stops at the capacity, the pipe fills, the writer blocks.
    await new Promise((r) => setTimeout(r, 1000));
    expect(output.endOffset('stdout')).toBeGreaterThanOrEqual(64 * 1024);
    expect(output.endOffset('stdout')).toBeLessThan(64 * 1024 + 256 * 1024);
    expect(containers.state(id).status).toBe('running');
    // Resume: a second reader from offset 1000 sees the same bytes again (nothing acked yet).
    const again = output.chunks({ from: { stdout: 1000 } });
    const first = await again.next();
    expect(first.value).toMatchObject({ stream: 'stdout', offset: 1000 });
    await again.return(undefined);
    const { chunks } = await collect(output);
    let expected = 0;
    for (const c of chunks) {
      expect(c.offset).toBe(expected);
      expected += c.data.length;
    }
    expect(expected).toBe(total);
    expect((await containers.wait(id)).exitCode).toBe(0);
    await containers.delete(id);
  });

  it('execs with exact exit codes and output, and a timeout kills the process itself', async () => {
    const id = nextId();
    await containers.create({ id, spec: testSpec(['sleep', '1000']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(id);
    const process = { cwd: '/', env: ['PATH=/bin'], user: { uid: 0, gid: 0 } };
    const seven = await containers.exec({
      containerId: id,
      execId: 'e1',
      process: { ...process, args: ['sh', '-c', 'echo in-exec; exit 7'] },
      stdio: pipes,
    });
    expect((await collect(outputOf(seven))).stdout).toBe('in-exec\n');
    expect((await seven.exit).exitCode).toBe(7);

    const slow = await containers.exec({
      containerId: id,
      execId: 'e2',
      process: { ...process, args: ['sleep', '1000'] },
      stdio: pipes,
      timeoutMs: 300,
    });
    const exit = await slow.exit;
    expect(exit).toMatchObject({ exitCode: 137, signal: 9 });
    expect(slow.timedOut).toBe(true);
    expect(existsSync(`/proc/${slow.pid}`)).toBe(false);
    expect(containers.state(id).status).toBe('running');
    await containers.delete(id);
  });

  it('gives a tty container a terminal of the requested size, its output arriving as stdout', async () => {
    const id = nextId();
    await containers.create({
      id,
      spec: testSpec(['sh', '-c', 'tty; stty size'], { tty: true }),
      rootfsPath: host.rootfs,
      stdio: { tty: true, stdin: false },
    });
    containers.process(id).resize(33, 101);
    await containers.start(id);
    const out = await collect(outputOf(containers.process(id)));
    expect(out.stdout).toMatch(/^\/dev\/pts\/\d+\r\n33 101\r\n$/);
    expect(out.stderr).toBe('');
    expect((await containers.wait(id)).exitCode).toBe(0);
    await containers.delete(id);
  });

  it('a restarted agent recovers its containers from the bundles, crun state and the reaper exit files', async () => {
    const running = nextId();
    const done = nextId();
    await containers.create({ id: running, spec: testSpec(['sleep', '1000']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(running);
    await containers.create({ id: done, spec: testSpec(['sh', '-c', 'exit 3']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(done);
    await containers.wait(done);
    // A second core on the same directories stands for the agent after a restart.
    const restarted = new Containers({
      runtime: { command: host.command, stateDir: host.stateDir, cgroupManager: 'disabled' },
      bundlesDir: host.bundlesDir,
      reaperPath: host.reaperPath,
      cgroupRoot: '/nonexistent-cgroup-root',
      // These tests read the processes' pipes; the spool path is tested through the agent service.
      spoolOutput: false,
    });
    expect((await restarted.recover(50)).sort()).toEqual([running, done].sort());
    expect(await restarted.wait(done)).toMatchObject({ exitCode: 3 });
    expect(restarted.state(running)).toMatchObject({ status: 'running', pid: containers.state(running).pid });
    expect(restarted.state(running).startedAtMs).toBe(containers.state(running).startedAtMs);
    await restarted.signal(running, 9, false);
    expect(await restarted.wait(running)).toMatchObject({ exitCode: 137, signal: 9 });
    await restarted.delete(running);
    await restarted.delete(done);
    // The first core's records are stale now; deleting through it is a no-op on crun's side.
    await containers.delete(running);
    await containers.delete(done);
  });

  it('runs an exec with a tty and stdin: input echoed by the terminal, exit code exact', async () => {
    const id = nextId();
    await containers.create({ id, spec: testSpec(['sleep', '1000']), rootfsPath: host.rootfs, stdio: pipes });
    await containers.start(id);
    const exec = await containers.exec({
      containerId: id,
      execId: 't1',
      process: { args: ['sh', '-c', 'read line; echo "got $line"; exit 5'], cwd: '/', env: ['PATH=/bin'] },
      stdio: { tty: true, stdin: true },
    });
    expect(exec.stdio.stderr).toBeUndefined();
    exec.stdio.stdin!.write('abc\n');
    const out = await collect(outputOf(exec));
    // The terminal echoes the input line, then the program's answer, with CRLF line ends.
    expect(out.stdout).toBe('abc\r\ngot abc\r\n');
    expect((await exec.exit).exitCode).toBe(5);
    await containers.delete(id);
  });
});
