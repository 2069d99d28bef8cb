/**
 * Exec, Attach and PortForward end to end: a real `kata-ts serve`, one pod VM under real QEMU
 * (TCG) with the real guest agent and crun, several containers in it, and clients speaking the
 * real protocols: our client-go-alike (SPDY and WebSocket) and, where it is present, the real
 * crictl v1.32 (Go's spdystream) for exec -i, exec -it (under `script` for a terminal), attach and
 * port-forward. Also a slow reader (the process is held back), a client killed mid-stream (its
 * process goes), and a daemon restart (open streams end with an error, new ones work).
 */

import { execFile, execFileSync, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allowLoopbackRegistries, pushBusyboxImage } from '../../helpers/busybox-image.js';
import { findCriTool } from '../../helpers/cri-tools.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { until as pollUntil } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { exitCodeOf, spdyCommand, spdyPortForward, wsCommand, wsPortForward } from '../../helpers/streaming-client.js';
import { scaledMs } from '../../helpers/time-scale.js';

const repo = path.resolve(__dirname, '../../..');
const CRICTL_PATH = findCriTool('crictl');
const CRICTL = CRICTL_PATH ?? 'crictl (not found)';

/**
 * The guest built from this checkout (its /init brings loopback up for port-forward; the agent
 * survives EPIPE on a tty's resize pipe), into the tests' own directory shared with the sandbox
 * agent test (same sources, same inputs: build-guest.sh is a no-op the second time), never the
 * installed one. KATA_TS_GUEST_DIR, when set, wins (a guest built elsewhere from this branch).
 */
function branchGuest(): Record<string, string> {
  const dir = process.env.KATA_TS_GUEST_DIR ?? process.env.KATA_TS_AGENT_GUEST_DIR ?? path.join(repo, '.cache/guest-agent');
  if (process.env.KATA_TS_GUEST_DIR === undefined) {
    execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
  }
  return {
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initramfs.cpio.gz'),
    guestImagePath: path.join(dir, 'guest.img'),
  };
}
const HAVE_CRICTL = CRICTL_PATH !== null;
const APPLETS = ['sleep', 'head', 'stty', 'httpd', 'kill', 'test', 'touch', 'mkdir', 'tr', 'wc', 'rm'];

function run(file: string, args: string[], input?: string, timeoutMs = 60_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(file, args, { timeout: timeoutMs, encoding: 'utf8' }, (err, stdout, stderr) => {
      const code =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code as number) : -1;
      resolve({ code, stdout, stderr });
    });
    if (input !== undefined) child.stdin?.end(input);
    else child.stdin?.end();
  });
}

const until = <T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> =>
  pollUntil(what, () => fn(), timeoutMs, 200);

describe('streaming through a pod VM (real QEMU, agent, crun; SPDY, WebSocket, crictl)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  let sid: string;
  let sandboxConfig: Record<string, unknown>;
  const ids: Record<string, string> = {};

  const crictl = (args: string[], input?: string, timeoutMs?: number) =>
    run(CRICTL, ['--runtime-endpoint', `unix://${rt.socketPath}`, '--timeout', '60s', ...args], input, timeoutMs);
  const execUrl = async (container: string, cmd: string[], extra: Record<string, boolean> = {}) =>
    (await rt.cri.runtime.Exec({ container_id: ids[container], cmd, stdout: true, stderr: !extra.tty, ...extra })).url;
  const execSync = (container: string, cmd: string[]) => rt.cri.runtime.ExecSync({ container_id: ids[container], cmd, timeout: 30 });
  const create = async (name: string, extra: Record<string, unknown>) => {
    const { container_id } = await rt.cri.runtime.CreateContainer({
      pod_sandbox_id: sid,
      config: { metadata: { name, attempt: 0 }, image: { image }, ...extra },
      sandbox_config: sandboxConfig,
    });
    await rt.cri.runtime.StartContainer({ container_id });
    ids[name] = container_id;
  };

  beforeAll(async () => {
    registry = await startRegistry();
    image = await pushBusyboxImage(registry, 'kata/busybox', 'stream', APPLETS);
    rt = await createTestRuntime({
      hypervisor: branchGuest(),
      images: { registriesConfigPath: '/dev/null' },
    });
    await allowLoopbackRegistries(rt);
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    sandboxConfig = { ...podConfig(rt, 'stream'), hostname: 'stream-pod', log_directory: path.join(rt.dir, 'pod-logs') };
    sid = (await rt.cri.runtime.RunPodSandbox({ config: sandboxConfig })).pod_sandbox_id;
    await create('shell', { command: ['sleep', '100000'], log_path: 'shell.log' });
    await create('web', {
      command: ['sh', '-c', 'mkdir -p /tmp/www && echo hello-from-pod > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www'],
      log_path: 'web.log',
    });
  }, scaledMs(300_000));

  afterAll(async () => {
    if (rt !== undefined) {
      const { items } = await rt.cri.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const s of items) await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: s.id }).catch(() => undefined);
      const keep = process.env.KATA_TS_KEEP_DAEMON_LOG;
      if (keep !== undefined) {
        await fsp.copyFile(rt.logFile, keep).catch(() => undefined);
        await fsp
          .cp(path.join(rt.stateDir, 'vm'), `${keep}.vm`, { recursive: true, filter: (src) => !src.includes('/shared') })
          .catch(() => undefined);
      }
      await rt.cleanup();
    }
    await registry?.stop();
  });

  it('exec without a tty over SPDY and WebSocket: stdout, stderr, stdin, exit codes', async () => {
    const r = await spdyCommand(await execUrl('shell', ['sh', '-c', 'echo out; echo err >&2; exit 3']));
    expect([r.stdout.toString(), r.stderr.toString(), exitCodeOf(r.status)]).toEqual(['out\n', 'err\n', 3]);
    const cat = await spdyCommand(await execUrl('shell', ['sh', '-c', 'tr a-z A-Z'], { stdin: true }), { stdin: Buffer.from('hello\n') });
    expect([cat.stdout.toString(), exitCodeOf(cat.status)]).toEqual(['HELLO\n', 0]);
    const ws = await wsCommand(await execUrl('shell', ['sh', '-c', 'cat; exit 7'], { stdin: true }), { stdin: Buffer.from('via ws') });
    expect([ws.protocol, ws.stdout.toString(), exitCodeOf(ws.status)]).toEqual(['v5.channel.k8s.io', 'via ws', 7]);
  });

  it('exec with a tty and stdin: a real pty in the guest, the resize reaches it', async () => {
    const url = await execUrl('shell', ['sh', '-c', 'read l; stty size; echo got:$l'], { tty: true, stdin: true });
    const r = await spdyCommand(url, { tty: true, stdin: Buffer.from('hello\n'), resize: { Width: 100, Height: 31 }, stdinDelayMs: 1000 });
    const text = r.stdout.toString();
    expect(text, r.status).toContain('31 100\r\n');
    expect(text).toContain('got:hello\r\n');
    expect(exitCodeOf(r.status)).toBe(0);
  });

  it('port-forward to a busybox httpd in the pod, over SPDY and WebSocket, through the agent', async () => {
    const url = async () => (await rt.cri.runtime.PortForward({ pod_sandbox_id: sid, port: [8080] })).url;
    const get = Buffer.from('GET /index.html HTTP/1.0\r\n\r\n');
    const body = await until('httpd to answer', async () => {
      const r = await spdyPortForward(await url(), 8080, get);
      return r.data.toString().includes('hello-from-pod') ? r : undefined;
    });
    expect(body.data.toString()).toMatch(/^HTTP\/1\.[01] 200/);
    const ws = await wsPortForward(await url(), 8080, get, 'hello-from-pod');
    expect(ws.data.toString()).toContain('hello-from-pod');
    const refused = await spdyPortForward(await url(), 9090, get);
    expect(refused.error).toMatch(/not forwarded/);
  });

  it('a slow reader holds the process back; every byte arrives once it reads', async () => {
    await execSync('shell', ['rm', '-f', '/tmp/finished']);
    const size = 24 * 1024 * 1024;
    let finishedWhilePaused = -1;
    const url = await execUrl('shell', ['sh', '-c', `head -c ${size} /dev/zero; touch /tmp/finished`]);
    const r = await spdyCommand(url, {
      pauseAfterFirstOutputMs: 3000,
      whilePaused: async () => {
        await new Promise((res) => setTimeout(res, 3000));
        finishedWhilePaused = (await execSync('shell', ['test', '-e', '/tmp/finished'])).exit_code;
      },
    });
    expect(finishedWhilePaused).toBe(1);
    expect(r.stdout.length).toBe(size);
    expect(exitCodeOf(r.status)).toBe(0);
    expect((await execSync('shell', ['test', '-e', '/tmp/finished'])).exit_code).toBe(0);
  });

  it.runIf(HAVE_CRICTL)('crictl exec -i, exec -it (in a terminal), exit codes', async () => {
    const piped = await crictl(['exec', '-i', ids.shell!, 'tr', 'a-z', 'A-Z'], 'echo hello\n');
    expect(piped).toMatchObject({ code: 0, stdout: 'ECHO HELLO\n' });
    const failed = await crictl(['exec', ids.shell!, 'sh', '-c', 'exit 5']);
    // crictl v1.32 reports the exit code it read from the Status (and exits 1 itself).
    expect(failed.stderr).toContain('command terminated with exit code 5');
    const line = `stty cols 77 rows 22; ${CRICTL} --runtime-endpoint unix://${rt.socketPath} exec -it ${ids.shell} stty size`;
    const tty = await run('script', ['-qec', line, '/dev/null']);
    expect(tty.stdout).toContain('22 77');
  });

  it.runIf(HAVE_CRICTL)('crictl attach to a container reading stdin (stdin_once ends it)', async () => {
    await create('reader', {
      command: ['sh', '-c', 'while read l; do echo "got $l"; done; echo bye'],
      stdin: true,
      stdin_once: true,
      log_path: 'reader.log',
    });
    const r = await crictl(['attach', '-i', ids.reader!], 'one\ntwo\n');
    expect(r.stdout).toContain('got one\ngot two\n');
    const status = await until('reader to exit', async () => {
      const s = (await rt.cri.runtime.ContainerStatus({ container_id: ids.reader })).status;
      return s!.state === 'CONTAINER_EXITED' ? s : undefined;
    });
    expect(status!.exit_code).toBe(0);
  });

  it.runIf(HAVE_CRICTL)('crictl port-forward to the pod', async () => {
    const child = spawn(CRICTL, ['--runtime-endpoint', `unix://${rt.socketPath}`, 'port-forward', sid, '18089:8080'], { stdio: 'pipe' });
    try {
      const text = await until('crictl port-forward to listen', async () => {
        const r = await run('curl', ['-s', '--max-time', '20', 'http://127.0.0.1:18089/index.html']);
        return r.code === 0 ? r.stdout : undefined;
      });
      expect(text).toBe('hello-from-pod\n');
    } finally {
      child.kill('SIGKILL');
    }
  });

  it.runIf(HAVE_CRICTL)('a client killed mid-stream: its process in the container goes too', async () => {
    await execSync('shell', ['rm', '-f', '/tmp/victim']);
    const child = spawn(
      CRICTL,
      ['--runtime-endpoint', `unix://${rt.socketPath}`, 'exec', ids.shell!, 'sh', '-c', 'echo $$ > /tmp/victim; exec sleep 1000'],
      {
        stdio: 'ignore',
      },
    );
    const pid = await until('the exec to start', async () => {
      const r = await execSync('shell', ['cat', '/tmp/victim']);
      return r.exit_code === 0 && r.stdout.length > 0 ? r.stdout.toString().trim() : undefined;
    });
    expect((await execSync('shell', ['kill', '-0', pid])).exit_code).toBe(0);
    child.kill('SIGKILL');
    await until('the exec process to be killed', async () =>
      (await execSync('shell', ['kill', '-0', pid])).exit_code !== 0 ? true : undefined,
    );
  });

  it('a daemon restart ends an open stream with an error; a new stream works after it', async () => {
    await execSync('shell', ['rm', '-f', '/tmp/restart']);
    const url = await execUrl('shell', ['sh', '-c', 'echo $$ > /tmp/restart; exec sleep 1000']);
    const open = spdyCommand(url);
    const pid = await until('the exec to start', async () => {
      const r = await execSync('shell', ['cat', '/tmp/restart']);
      return r.exit_code === 0 && r.stdout.length > 0 ? r.stdout.toString().trim() : undefined;
    });
    await rt.restart();
    const ended = await open;
    expect(JSON.parse(ended.status)).toMatchObject({ status: 'Failure', message: expect.stringMatching(/shutting down/) });
    await until('the process of the ended stream to go', async () =>
      (await execSync('shell', ['kill', '-0', pid])).exit_code !== 0 ? true : undefined,
    );
    const again = await spdyCommand(await execUrl('shell', ['echo', 'after restart']));
    expect([again.stdout.toString(), exitCodeOf(again.status)]).toEqual(['after restart\n', 0]);
  });
});
