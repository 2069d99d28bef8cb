/**
 * The VMM jail proven by attack, with real QEMU (TCG) through a real `kata-ts serve`.
 *
 * `hypervisor.qemuBinary` is a hostile program (test/fixtures/hostile/hostile-vmm.c, compiled here)
 * that the runtime starts exactly as it starts QEMU: bound into the jail, through kata-ts-jailer and
 * setpriv, with QEMU's argv. It stands for code that took QEMU over (and runs without QEMU's own
 * seccomp filter, the harder case): it tries each attack below, writes what happened beside its QMP
 * socket, then execs the real QEMU so the pod boots and the report can be read.
 *
 * Three boots: pod B (the victim, the same program with no targets: it only execs QEMU), then the
 * daemon restarted with the targets in its environment (B's QEMU, work dir and QMP socket, a host
 * file anyone may read, a host dir anyone may write, a listener on 127.0.0.1, a host abstract
 * socket), pod A on the cold path, and a pooled VM on the pool's path. Each attack is a named test
 * per path, judged from the report and, where the attack would leave a trace on the host (a file, a
 * connection, a dead process), from the host too.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { isSameLiveProcess, readProcStat } from '../../../src/common/procfs.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { until as pollUntil } from '../../helpers/poll.js';
import { createTestRuntime, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const execFileAsync = promisify(execFile);
const SOURCE = path.join(packageRoot(), 'test', 'fixtures', 'hostile', 'hostile-vmm.c');
/** Processes the hostile program tries to hold at once: far past any pod's pids.max. */
const FORKS = 4096;

/** Every attack the program makes, by the name it reports. */
const ATTACKS = [
  'read a host file by absolute path',
  'read a host file by relative path',
  'read a host file through ..',
  'read /etc/passwd',
  'read etc/passwd from the working directory',
  'read /proc/1/root',
  'read /proc/self/cwd',
  'write a host file by absolute path',
  'write a host file by relative path',
  'write tmp/x from the working directory',
  "read another pod's work dir",
  "connect to another pod's QMP socket",
  "connect to the runtime's CRI socket",
  "ptrace another pod's QEMU",
  "process_vm_readv another pod's QEMU",
  "kill another pod's QEMU",
  "signal the node's init",
  'connect to 127.0.0.1 on the host',
  'connect to a host abstract unix socket',
  'create a device node in /dev',
  'create a device node in its own dir',
  'mount proc',
  'raise RLIMIT_NOFILE',
  'raise RLIMIT_CORE',
  'raise RLIMIT_MEMLOCK',
  'become root',
  'user namespace chroot escape',
  'fork past pids.max',
] as const;

type Report = Record<string, { outcome: 'blocked' | 'BREACH'; detail: string } | number | string>;

interface Info {
  pid: number;
  workDir: string;
  confinement: { vmmDir: string | null; identity: { uid: number } | null } | null;
}

describe("a hostile program in QEMU's place: every attack fails, on the cold and the pool path", () => {
  let rt: TestRuntime;
  let binDir = '';
  let victim: Info;
  let victimStart = 0;
  const reports: Record<'cold' | 'pooled', Report> = { cold: {}, pooled: {} };
  const tcpConnections: string[] = [];
  const abstractConnections: string[] = [];
  let tcp: net.Server | undefined;
  let abstract: net.Server | undefined;
  const abstractName = `kata-ts-attack-${randomBytes(6).toString('hex')}`;
  const hostFile = () => path.join(rt.dir, 'host-readable.txt');
  const hostDir = () => path.join(rt.dir, 'host-writable');

  async function info(id: string): Promise<Info> {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as Info;
  }

  async function readReport(vmmDir: string): Promise<Report> {
    return JSON.parse(await fsp.readFile(path.join(vmmDir, 'attack-report.json'), 'utf8')) as Report;
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    binDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-hostile-'));
    await fsp.chmod(binDir, 0o755);
    const wrapper = path.join(binDir, 'hostile-vmm');
    await execFileAsync('gcc', ['-O2', '-Wall', '-o', wrapper, SOURCE]);
    rt = await createTestRuntime({ hypervisor: { qemuBinary: wrapper } });
    await fsp.writeFile(hostFile(), 'readable by anyone on the host\n', { mode: 0o644 });
    await fsp.chmod(hostFile(), 0o644);
    await fsp.mkdir(hostDir(), { mode: 0o777 });
    await fsp.chmod(hostDir(), 0o777);
    tcp = net.createServer((s) => {
      tcpConnections.push(String(s.remoteAddress));
      s.destroy();
    });
    await new Promise<void>((resolve) => tcp!.listen(0, '127.0.0.1', resolve));
    abstract = net.createServer((s) => {
      abstractConnections.push('connected');
      s.destroy();
    });
    await new Promise<void>((resolve) => abstract!.listen(`\0${abstractName}`, resolve));

    // The victim: the same program without targets only execs QEMU.
    await rt.start();
    const b = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'victim') })).pod_sandbox_id;
    victim = await info(b);
    victimStart = readProcStat(victim.pid)!.startTimeTicks;
    await rt.stop();

    Object.assign(process.env, {
      KATA_TS_ATTACK_HOST_FILE: hostFile(),
      KATA_TS_ATTACK_HOST_DIR: hostDir(),
      KATA_TS_ATTACK_PEER_PID: String(victim.pid),
      KATA_TS_ATTACK_PEER_DIR: victim.workDir,
      KATA_TS_ATTACK_PEER_SOCKET: path.join(victim.confinement!.vmmDir!, 'qmp.sock'),
      KATA_TS_ATTACK_CRI_SOCKET: rt.socketPath,
      KATA_TS_ATTACK_TCP_PORT: String((tcp.address() as net.AddressInfo).port),
      KATA_TS_ATTACK_ABSTRACT: abstractName,
      KATA_TS_ATTACK_FORKS: String(FORKS),
    });
    try {
      // The cold path.
      await rt.start();
      const a = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'attacker') })).pod_sandbox_id;
      reports.cold = await readReport((await info(a)).confinement!.vmmDir!);
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: a });
      await rt.stop();
      // The pool's path: a pooled VM, booted by the pool, started the same way.
      const config = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { pool: Record<string, unknown> };
      config.pool.sizes = { 'kata-ts': 1 };
      await fsp.writeFile(rt.configPath, JSON.stringify(config));
      await rt.start();
      const vmmDir = await pollUntil(
        'the pooled VM to write its report',
        async () => {
          for (const f of await fsp.readdir(path.join(rt.stateDir, 'pool')).catch(() => [] as string[])) {
            if (!f.endsWith('.json')) continue;
            const doc = JSON.parse(await fsp.readFile(path.join(rt.stateDir, 'pool', f), 'utf8')) as {
              record: { confinement: { vmmDir: string } | null };
            };
            const dir = doc.record.confinement?.vmmDir;
            // Written in one go before QEMU runs: complete once it parses.
            if (dir !== undefined && (await readReport(dir).catch(() => undefined)) !== undefined) return dir;
          }
          return undefined;
        },
        scaledMs(300_000),
        500,
      );
      reports.pooled = await readReport(vmmDir);
    } finally {
      for (const key of Object.keys(process.env)) if (key.startsWith('KATA_TS_ATTACK_')) delete process.env[key];
    }
  }, scaledMs(600_000));

  afterAll(async () => {
    tcp?.close();
    abstract?.close();
    await rt?.cleanup();
    if (binDir !== '') await fsp.rm(binDir, { recursive: true, force: true });
  });

  for (const where of ['cold', 'pooled'] as const) {
    describe(`${where} path`, () => {
      it('the report lists every attack, made as an unprivileged uid whose working directory is the jail root', () => {
        const report = reports[where];
        const attempted = Object.keys(report).filter((k) => typeof report[k] === 'object');
        expect(attempted.sort()).toEqual([...ATTACKS].sort());
        expect(report.uid).not.toBe(0);
        expect(report.cwd).toBe('/');
      });
      for (const attack of ATTACKS) {
        it(`${attack}: blocked`, () => {
          const entry = reports[where][attack];
          expect({ attack, ...(entry as object) }).toMatchObject({ attack, outcome: 'blocked' });
        });
      }
      it('pids.max held the fork attempt to a few hundred processes at most', () => {
        expect(reports[where]['forks held']).toBeLessThan(FORKS);
      });
    });
  }

  it("on the host: nothing written, no connection reached a host listener, the other pod's QEMU lives", async () => {
    expect(await fsp.readdir(hostDir())).toEqual([]);
    await expect(fsp.stat('/tmp/kata-ts-vmm-attack')).rejects.toThrow(/ENOENT/);
    expect([tcpConnections, abstractConnections]).toEqual([[], []]);
    expect(isSameLiveProcess(victim.pid, victimStart)).toBe(true);
  });
});
