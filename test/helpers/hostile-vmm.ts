/**
 * The hostile program in QEMU's place (test/fixtures/hostile/hostile-vmm.c): compiled for a test,
 * the names of the attacks it reports, and the environment that gives it its targets. Used by the
 * daemon's attack test (cold and pool paths) and the shim's (behind containerd).
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { packageRoot } from '../../src/common/paths.js';

const execFileAsync = promisify(execFile);
const SOURCE = path.join(packageRoot(), 'test', 'fixtures', 'hostile', 'hostile-vmm.c');

/** Processes the hostile program tries to hold at once: far past any pod's pids.max. */
export const HOSTILE_FORKS = 4096;

/** Every attack the program makes, by the name it reports. */
export const VMM_ATTACKS = [
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
  'attach a host SysV shared memory segment',
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

export type AttackReport = Record<string, { outcome: 'blocked' | 'BREACH'; detail: string } | number | string>;

/** The report the program wrote beside its QMP socket (in the VMM dir); undefined until complete. */
export async function readAttackReport(vmmDir: string): Promise<AttackReport | undefined> {
  try {
    return JSON.parse(await fsp.readFile(path.join(vmmDir, 'attack-report.json'), 'utf8')) as AttackReport;
  } catch {
    return undefined;
  }
}

/** What the attacks aim at on the host, and what would show that one got through. */
export class AttackTargets {
  readonly dir: string;
  readonly binary: string;
  readonly tcpConnections: string[] = [];
  readonly abstractConnections: string[] = [];
  readonly abstractName = `kata-ts-attack-${randomBytes(6).toString('hex')}`;
  /** A host SysV shared memory segment anyone may attach (mode 0666), made with ipcmk, removed by close(). */
  shmId = -1;
  private tcp: net.Server | undefined;
  private abstract: net.Server | undefined;

  private constructor(dir: string) {
    this.dir = dir;
    this.binary = path.join(dir, 'hostile-vmm');
  }

  /** A dir of its own (0755, so the jail can bind the program), the program compiled into it, the listeners. */
  static async create(): Promise<AttackTargets> {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-hostile-'));
    await fsp.chmod(dir, 0o755);
    const t = new AttackTargets(dir);
    await execFileAsync('gcc', ['-O2', '-Wall', '-o', t.binary, SOURCE]);
    await fsp.writeFile(t.hostFile, 'readable by anyone on the host\n');
    await fsp.chmod(t.hostFile, 0o644);
    await fsp.mkdir(t.hostDir);
    await fsp.chmod(t.hostDir, 0o777);
    t.tcp = net.createServer((s) => {
      t.tcpConnections.push(String(s.remoteAddress));
      s.destroy();
    });
    await new Promise<void>((resolve) => t.tcp!.listen(0, '127.0.0.1', resolve));
    t.abstract = net.createServer((s) => {
      t.abstractConnections.push('connected');
      s.destroy();
    });
    await new Promise<void>((resolve) => t.abstract!.listen(`\0${t.abstractName}`, resolve));
    const { stdout } = await execFileAsync('ipcmk', ['-M', '4096', '-p', '0666']);
    t.shmId = Number(/id: (\d+)/.exec(stdout)?.[1] ?? Number.NaN);
    if (!Number.isSafeInteger(t.shmId)) throw new Error(`ipcmk said: ${stdout}`);
    return t;
  }

  get hostFile(): string {
    return path.join(this.dir, 'host-readable.txt');
  }

  get hostDir(): string {
    return path.join(this.dir, 'host-writable');
  }

  /** The program's environment: `peer` is another pod's QEMU (pid, work dir, QMP socket). */
  env(peer: { pid: number; workDir: string; qmpSocket: string }, criSocket: string): Record<string, string> {
    return {
      KATA_TS_ATTACK_HOST_FILE: this.hostFile,
      KATA_TS_ATTACK_HOST_DIR: this.hostDir,
      KATA_TS_ATTACK_PEER_PID: String(peer.pid),
      KATA_TS_ATTACK_PEER_DIR: peer.workDir,
      KATA_TS_ATTACK_PEER_SOCKET: peer.qmpSocket,
      KATA_TS_ATTACK_CRI_SOCKET: criSocket,
      KATA_TS_ATTACK_TCP_PORT: String((this.tcp!.address() as net.AddressInfo).port),
      KATA_TS_ATTACK_ABSTRACT: this.abstractName,
      KATA_TS_ATTACK_SHM_ID: String(this.shmId),
      KATA_TS_ATTACK_FORKS: String(HOSTILE_FORKS),
    };
  }

  /** Traces an attack that got through would leave on the host ([] each when none did). */
  async traces(): Promise<{ written: string[]; tcp: string[]; abstract: string[]; tmp: boolean }> {
    const tmp = await fsp.stat('/tmp/kata-ts-vmm-attack').then(
      () => true,
      () => false,
    );
    return { written: await fsp.readdir(this.hostDir), tcp: this.tcpConnections, abstract: this.abstractConnections, tmp };
  }

  async close(): Promise<void> {
    this.tcp?.close();
    this.abstract?.close();
    if (this.shmId >= 0) await execFileAsync('ipcrm', ['-m', String(this.shmId)]).catch(() => undefined);
    await fsp.rm(this.dir, { recursive: true, force: true });
  }
}

/**
 * The named tests of one report (call inside a describe): every attack listed and blocked, made
 * as an unprivileged uid from the jail's root, and the fork attempt held below what it asked for.
 */
export function attackReportTests(report: () => AttackReport, it: (name: string, fn: () => void) => void, expect: ExpectLike): void {
  it('the report lists every attack, made as an unprivileged uid whose working directory is the jail root', () => {
    const r = report();
    const attempted = Object.keys(r).filter((k) => typeof r[k] === 'object');
    expect(attempted.sort()).toEqual([...VMM_ATTACKS].sort());
    expect(r.uid).not.toBe(0);
    expect(r.cwd).toBe('/');
  });
  for (const attack of VMM_ATTACKS) {
    it(`${attack}: blocked`, () => {
      expect({ attack, ...(report()[attack] as object) }).toMatchObject({ attack, outcome: 'blocked' });
    });
  }
  it('pids.max held the fork attempt far below what it asked for', () => {
    expect(report()['forks held']).toBeLessThan(HOSTILE_FORKS);
  });
}

/** The part of vitest's `expect` the report tests use (the helper imports no test runner). */
type ExpectLike = (value: unknown) => {
  toEqual(v: unknown): void;
  toBe(v: unknown): void;
  toMatchObject(v: object): void;
  toBeLessThan(v: number): void;
  not: { toBe(v: unknown): void };
};
