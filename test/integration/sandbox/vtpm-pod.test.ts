/**
 * A vtpm pod through a real `kata-ts serve` with the `kata-ts-cvm` handler (tee.kind auto, which
 * this host, without SEV-SNP or TDX, resolves to vtpm): real QEMU (TCG) booting OVMF from pflash
 * with the pod's copy of the vars, a real swtpm per pod (src/tpm/swtpm.ts) behind a tpm-crb
 * device, and a container running in the guest.
 *
 * - the verbose status says vtpm and why; the record holds swtpm (pid, its own uid, the EK
 *   certificate, which verifies against the node's CA), which runs in the pod's cgroup beside
 *   QEMU, as another uid than QEMU's;
 * - the guest sees a TPM 2.0 (`/sys/class/tpm/tpm0`, read from inside the container) whose PCR 9
 *   (OVMF measured the initrd and the command line there) is not all zeros;
 * - the daemon restarts: the pod is found again READY with the same swtpm, and the container
 *   still answers;
 * - RemovePodSandbox leaves no swtpm process, no state dir, no identity lease of the pod.
 *
 * One boot. The default handler's pods are covered by the other sandbox tests.
 */
import { X509Certificate } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSameLiveProcess } from '../../../src/common/procfs.js';
import { initTpmCa } from '../../../src/tpm/ca.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const NOTHING = { processes: [], workDirs: [], records: [], cgroups: [] };
const HANDLER = 'kata-ts-cvm';

interface Info {
  pid: number;
  workDir: string;
  tee: { kind: string; reason: string };
  tpm: { pid: number; running: boolean; uid: number | null; stateDir: string; ekCertPem: string } | null;
  confinement: { identity: { uid: number; gid: number; lease: string } | null } | null;
  cgroup: Record<string, unknown>;
  plan: { qemu: { argv: string[] }; tee: { kind: string; setting: string; launchProblem: string | null } | null };
  referenceValues: { schema: string; tee: string; vtpm?: { pcrs: Record<string, string> } } | null;
}

/** The uid a process runs as (the real one, from /proc). */
function uidOf(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Uid:'));
  return Number(line?.split(/\s+/)[1]);
}

/** Every cgroup path of a process (hierarchy -> path), from /proc/<pid>/cgroup. */
function cgroupsOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .trim()
    .split('\n')
    .map((l) => l.split(':').slice(2).join(':'));
}

describe('a vtpm pod (OVMF + swtpm, TCG)', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let image: string;
  let sid = '';
  let cid = '';
  let first: Info;
  let caCertPem = '';

  const info = async (id: string): Promise<Info> => {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as Info;
  };
  const exec = async (cmd: string[]) => {
    const r = await rt.cri.runtime.ExecSync({ container_id: cid, cmd, timeout: 30 });
    return { code: r.exit_code, out: Buffer.from(r.stdout).toString('utf8').trim() };
  };

  beforeAll(async () => {
    await ensureGuestAssets();
    registry = await startRegistry();
    const built = await buildImage({ layers: [{ entries: busyboxBaseEntries(), compression: 'gzip' }], cmd: ['/bin/sh'] });
    await new RegistryPusher(registry.url).pushImage('kata/tpm', '1.0', built);
    image = `${registry.host}/kata/tpm:1.0`;
    rt = await createTestRuntime({});
    const registries = path.join(rt.dir, 'registries.json');
    await fsp.writeFile(registries, JSON.stringify({ registries: { '127.0.0.1:*': { plainHttp: true } } }));
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    // The node's EK CA, made for the test's runtime as setup makes the node's (kata-ts tpm-ca init).
    const caDir = path.join(rt.dir, 'tpm-ca');
    caCertPem = (await initTpmCa(caDir)).ca.current.certPem;
    cfg.images = { registriesConfigPath: registries };
    cfg.hypervisor = { ...(cfg.hypervisor as object), tpm: { caDir } };
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const config = podConfig(rt, 'vtpm');
    sid = (await rt.cri.runtime.RunPodSandbox({ config, runtime_handler: HANDLER })).pod_sandbox_id;
    cid = (
      await rt.cri.runtime.CreateContainer({
        pod_sandbox_id: sid,
        config: {
          metadata: { name: 'app', attempt: 0 },
          image: { image },
          command: ['/bin/sh', '-c', 'sleep 3600'],
          log_path: 'app/0.log',
        },
        sandbox_config: config,
      })
    ).container_id;
    await rt.cri.runtime.StartContainer({ container_id: cid });
    first = await info(sid);
  }, scaledMs(400_000));

  afterAll(async () => {
    await rt?.cleanup();
    await registry?.stop();
  });

  it('the status says vtpm and why; QEMU boots OVMF from pflash with the pod copy of the vars and a tpm-crb on swtpm', () => {
    expect(first.tee).toEqual({ kind: 'vtpm', reason: 'no SNP or TDX on this host' });
    expect(first.plan.tee).toMatchObject({ setting: 'auto', kind: 'vtpm', launchProblem: null });
    const argv = first.plan.qemu.argv;
    expect(argv).toContain('if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd');
    expect(argv.some((a) => /^if=pflash,format=raw,unit=1,file=.*\/vmm\/OVMF_VARS\.fd$/.test(a))).toBe(true);
    expect(argv).toContain('tpm-crb,id=tpmcrb0,tpmdev=tpm0');
  });

  it('swtpm runs as an identity of its own (not root, not QEMU), in the pod cgroup beside QEMU, with an EK certificate recorded', () => {
    const tpm = first.tpm;
    expect(tpm).not.toBeNull();
    expect(tpm!.running).toBe(true);
    const qemuUid = first.confinement?.identity?.uid;
    expect(qemuUid).toBeGreaterThan(0);
    expect(tpm!.uid).toBeGreaterThan(0);
    expect(tpm!.uid).not.toBe(qemuUid);
    expect(uidOf(tpm!.pid)).toBe(tpm!.uid);
    expect(uidOf(first.pid)).toBe(qemuUid);
    const qemuCgroups = cgroupsOf(first.pid).filter((c) => c.includes(rt.cgroupRoot));
    expect(qemuCgroups.length).toBeGreaterThan(0);
    expect(cgroupsOf(tpm!.pid).filter((c) => c.includes(rt.cgroupRoot))).toEqual(qemuCgroups);
    // The EK certificate the pod's TPM presents is signed by the node's CA.
    const ek = new X509Certificate(tpm!.ekCertPem);
    const ca = new X509Certificate(caCertPem);
    expect(ek.checkIssued(ca)).toBe(true);
    expect(ek.verify(ca.publicKey)).toBe(true);
  });

  it('the guest sees a TPM 2.0 that OVMF measured into (PCR 9 is not zero), read from the container', async () => {
    expect(await exec(['cat', '/sys/class/tpm/tpm0/tpm_version_major'])).toEqual({ code: 0, out: '2' });
    const pcr9 = await exec(['cat', '/sys/class/tpm/tpm0/pcr-sha256/9']);
    expect(pcr9.code).toBe(0);
    expect(pcr9.out).toMatch(/^[0-9A-F]{64}$/i);
    expect(pcr9.out).not.toMatch(/^0+$/);
  });

  it("the guest's PCRs 4, 7, 8 and 9 equal the values predicted before boot (the status's referenceValues, as plan --measurements computes them)", async () => {
    const predicted = first.referenceValues;
    expect(predicted?.schema).toBe('kata-ts/reference-values/v1');
    expect(predicted?.tee).toBe('vtpm');
    const pcrs = predicted?.vtpm?.pcrs ?? {};
    expect(Object.keys(pcrs)).toEqual(['4', '7', '8', '9']);
    for (const [pcr, value] of Object.entries(pcrs)) {
      const read = await exec(['cat', `/sys/class/tpm/tpm0/pcr-sha256/${pcr}`]);
      expect({ pcr, value: read.out.toLowerCase() }).toEqual({ pcr, value });
    }
  });

  it(
    'a restarted daemon finds the pod READY with the same swtpm, and the container still answers',
    async () => {
      await rt.restart();
      const again = await info(sid);
      const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: sid });
      expect(r.status?.state).toBe('SANDBOX_READY');
      expect(again.tpm?.pid).toBe(first.tpm?.pid);
      expect(again.tpm?.running).toBe(true);
      expect((await exec(['cat', '/sys/class/tpm/tpm0/tpm_version_major'])).out).toBe('2');
    },
    scaledMs(120_000),
  );

  it(
    'remove leaves no swtpm, no state dir, no identity lease of the pod',
    async () => {
      const tpm = first.tpm!;
      const leaseDir = path.dirname(first.confinement!.identity!.lease);
      const startTicks = Number(readFileSync(`/proc/${tpm.pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[19]);
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      expect(isSameLiveProcess(tpm.pid, startTicks)).toBe(false);
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      await expect(fsp.stat(tpm.stateDir)).rejects.toThrow();
      for (const uid of [tpm.uid!, first.confinement!.identity!.uid]) {
        const lease = await fsp.readFile(path.join(leaseDir, String(uid)), 'utf8').catch(() => '');
        expect(lease).not.toContain(sid);
      }
      expect(await leftovers(rt, { vmmCgroupsOnly: true })).toEqual(NOTHING);
    },
    scaledMs(120_000),
  );
});
