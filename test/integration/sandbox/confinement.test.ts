/**
 * The confined VMM with real QEMU (TCG), through a real `kata-ts serve`. Two boots: pod A on the
 * default handler (confined: seccomp, a uid/gid of its own, no capabilities, no_new_privs, a
 * jail) and pod B on a handler that opts out with a reason (QEMU as root, as before this change).
 *
 * - /proc/<pid>/status of A's QEMU: Uid/Gid not 0, no capability at all, NoNewPrivs 1, Seccomp 2;
 *   of B's: uid 0, no filter. virtiofsd keeps its seccomp filter and loses mknod and setfcap.
 * - A simulated VFIO group (no VFIO hardware here: the fixture tree fixtures/sysfs/gpu-audio and
 *   pcie.simulateVfioWith, as the containers test does): A's jail holds its node, owned by A's
 *   uid while A holds it; the host's node is never changed; at remove the jail's node is gone.
 * - With the daemon stopped (QEMU serves one QMP client), A is asked through QMP to open host
 *   files with blockdev-add (B's work dir, a file of the test, /etc/hostname): refused, while its
 *   own guest image opens; B, unconfined, opens the same host file (the control). Then hot-plug
 *   (an emulated PCIe NIC onto a reserved port, a vCPU) and a virtio-mem resize in A.
 * - B's record is put back to format 5 (a pod started before this change), the daemon restarted:
 *   both are found again READY, the confined one with its identity and lease.
 * - Removal gives the identity back and leaves nothing (jail mounts, leases, work dirs).
 */
import { promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import { connectQmp, plugVcpus, type QmpClient, setVirtioMemSize, virtioMemPluggedMiB } from '../../../src/hypervisor/index.js';
import { SANDBOX_RECORD_VERSION } from '../../../src/runtime/sandbox/record.js';
import { ensureGuestAssets } from '../../helpers/hypervisor-guest.js';
import { untilMatches } from '../../helpers/poll.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const FIXTURE = path.join(packageRoot(), 'fixtures', 'sysfs', 'gpu-audio');
const NOTHING = { processes: [], workDirs: [], records: [], cgroups: [] };
const ROOT_HANDLER = 'kata-ts-root';
const OPT_OUT = 'integration test: the unconfined baseline';
const SECCOMP = 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny';

interface Info {
  pid: number;
  workDir: string;
  shape: { vcpus: number; maxVcpus: number; memoryMiB: number; maxMemoryMiB: number };
  confinement: {
    seccomp: string | null;
    identity: { uid: number; gid: number; lease: string } | null;
    jailDir: string | null;
    vmmDir: string | null;
    optOutReason: string | null;
  } | null;
  virtiofsd: { pid: number } | null;
  topology: Array<{ id: string; reservedFor: string | null }>;
}

/** The fields of /proc/<pid>/status the issue names. */
function procStatus(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(`/proc/${pid}/status`, 'utf8').split('\n')) {
    const m = /^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):\s*(.*)$/.exec(line);
    if (m !== null) out[m[1]!] = m[2]!.trim();
  }
  return out;
}

/** virtiofsd's sandbox=namespace child: the process that serves the guest's requests. */
function childOf(pid: number): number {
  const [child] = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/);
  return Number(child);
}

const CAP_MKNOD = 27n;
const CAP_SETFCAP = 31n;

describe('confined VMMs with real QEMU', () => {
  let rt: TestRuntime;
  let a = '';
  let b = '';
  let infoA: Info;
  let infoB: Info;
  const hostFile = () => path.join(rt.dir, 'host-secret.txt');

  async function info(id: string): Promise<Info> {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as Info;
  }

  beforeAll(async () => {
    await ensureGuestAssets();
    rt = await createTestRuntime({
      pcie: {
        sysfsRoot: path.join(FIXTURE, 'sys'),
        devRoot: path.join(FIXTURE, 'dev'),
        devNumbersFile: path.join(FIXTURE, 'dev-numbers.json'),
        cdiSpecDirs: [],
        simulateVfioWith: 'e1000e',
      },
      handlers: { [ROOT_HANDLER]: { vmmConfinement: { seccomp: false, unprivileged: false, optOutReason: OPT_OUT } } },
    });
    await fsp.writeFile(hostFile(), 'not for any VM\n', { mode: 0o644 });
    await rt.start();
    // A announces a container with the fixture's GPU (IOMMU group 12): its two functions get ports
    // reserved for hot-plug, and the group is the pod's from boot to remove.
    const gpu = { container_path: '/dev/vfio/12', host_path: '/dev/vfio/12', permissions: 'rw' };
    const q = (s: string) => ({ string: s });
    a = (
      await rt.cri.runtime.RunPodSandbox({
        config: podConfig(rt, 'confined', {
          pod_resources: {
            containers: [
              {
                name: 'gpu',
                type: 'REGULAR_CONTAINER',
                kubernetes_resources: { requests: { cpu: q('250m'), memory: q('128Mi') }, limits: {} },
                devices: [gpu],
              },
            ],
          },
        }),
      })
    ).pod_sandbox_id;
    b = (await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'unconfined'), runtime_handler: ROOT_HANDLER })).pod_sandbox_id;
    [infoA, infoB] = await Promise.all([info(a), info(b)]);
  }, scaledMs(300_000));

  afterAll(async () => {
    await rt?.cleanup();
  });

  it('A: its own uid/gid, no capabilities, no_new_privs, seccomp; B (opted out): root without a filter', () => {
    const identity = infoA.confinement?.identity;
    expect(identity).toBeDefined();
    expect(identity!.uid).toBeGreaterThanOrEqual(2_000_000_000);
    const id = String(identity!.uid);
    expect(procStatus(infoA.pid)).toEqual({
      Uid: `${id}\t${id}\t${id}\t${id}`,
      Gid: `${id}\t${id}\t${id}\t${id}`,
      Groups: '',
      CapInh: '0000000000000000',
      CapPrm: '0000000000000000',
      CapEff: '0000000000000000',
      CapBnd: '0000000000000000',
      CapAmb: '0000000000000000',
      NoNewPrivs: '1',
      Seccomp: '2',
    });
    expect(infoA.confinement).toMatchObject({
      seccomp: SECCOMP,
      jailDir: path.join(infoA.workDir, 'jail'),
      vmmDir: path.join(infoA.workDir, 'vmm'),
      optOutReason: null,
    });
    const b = procStatus(infoB.pid);
    expect([b.Uid?.split('\t')[0], b.CapEff === '0000000000000000', b.Seccomp]).toEqual(['0', false, '0']);
    expect(infoB.confinement).toEqual({ seccomp: null, identity: null, jailDir: null, vmmDir: null, optOutReason: OPT_OUT });
    // The lease names A's record.
    const lease = JSON.parse(readFileSync(identity!.lease, 'utf8')) as { sandboxId: string; record: string };
    expect(lease).toEqual({ sandboxId: a, record: path.join(rt.stateDir, 'sandboxes', `${a}.json`) });
  });

  it("A's root is its jail: /usr read only, its own /dev, its VMM dir, nothing else; its files are its uid's", async () => {
    const jail = infoA.confinement!.jailDir!;
    // pivot_root in a mount namespace of its own: its root and its working directory are that
    // namespace's `/` (the jail), which is neither ours nor the daemon's.
    expect([await fsp.readlink(`/proc/${infoA.pid}/root`), await fsp.readlink(`/proc/${infoA.pid}/cwd`)]).toEqual(['/', '/']);
    const ownNs = await fsp.readlink(`/proc/${infoA.pid}/ns/mnt`);
    expect([await fsp.readlink('/proc/self/ns/mnt'), await fsp.readlink(`/proc/${rt.pid()}/ns/mnt`)]).not.toContain(ownNs);
    // The jail's mounts are made in the daemon's mount namespace, then copied into QEMU's.
    const root = `/proc/${infoA.pid}/root`;
    const mounts = await rt.mountinfo();
    for (const point of [jail, `${jail}/usr`, `${jail}/dev`, `${jail}${infoA.confinement!.vmmDir}`]) expect(mounts).toContain(` ${point} `);
    // bin, lib, lib64, sbin: links into /usr; sys: QEMU's VFIO links; tmp/...: the VMM dir at its own path.
    expect((await fsp.readdir(root)).sort()).toEqual(['bin', 'dev', 'lib', 'lib64', 'sbin', 'sys', 'tmp', 'usr']);
    expect(await fsp.readdir(`${root}/usr/bin`)).toContain('qemu-system-x86_64');
    const { uid, gid } = infoA.confinement!.identity!;
    const vmm = await fsp.stat(infoA.confinement!.vmmDir!);
    expect([vmm.uid, vmm.gid, vmm.mode & 0o777]).toEqual([uid, gid, 0o700]);
    for (const name of ['qmp.sock', 'ready.sock', 'agent.sock', 'vfs.sock']) {
      const st = await fsp.stat(path.join(infoA.confinement!.vmmDir!, name));
      expect([name, st.uid, st.mode & 0o777]).toEqual([name, uid, 0o600]);
    }
    // The work dir stays root's: QEMU cannot swap what the daemon mounts through.
    const work = await fsp.stat(infoA.workDir);
    expect([work.uid, work.mode & 0o777]).toEqual([0, 0o700]);
    // No NIC (network.mode none in tests): no net/tun; TCG: no kvm.
    expect((await fsp.readdir(`${root}/dev`)).sort()).toEqual(['null', 'random', 'urandom', 'vfio', 'zero']);
  });

  it("a simulated VFIO group (no VFIO hardware here) is the pod's uid's in its jail while held; the host's node is untouched", async () => {
    const { uid, gid } = infoA.confinement!.identity!;
    const jailed = await fsp.stat(`/proc/${infoA.pid}/root/dev/vfio/12`);
    expect([jailed.uid, jailed.gid, jailed.mode & 0o777]).toEqual([uid, gid, 0o600]);
    const host = await fsp.stat(path.join(FIXTURE, 'dev', 'vfio', '12'));
    expect([host.uid, host.mode & 0o777]).toEqual([0, 0o644]);
    expect(infoA.topology.filter((p) => p.reservedFor !== null).map((p) => p.id)).toEqual(['rp0', 'rp1']);
    // The sysfs link QEMU's vfio-pci reads for the group number.
    expect(await fsp.readlink(`/proc/${infoA.pid}/root/sys/bus/pci/devices/0000:01:00.0/iommu_group`)).toMatch(/\/12$/);
  });

  it('virtiofsd keeps its seccomp filter and serves without CAP_MKNOD or CAP_SETFCAP', () => {
    for (const info of [infoA, infoB]) {
      const server = childOf(info.virtiofsd!.pid);
      const st = procStatus(server);
      expect(st.Seccomp).toBe('2');
      const eff = BigInt(`0x${st.CapEff}`);
      expect([(eff >> CAP_MKNOD) & 1n, (eff >> CAP_SETFCAP) & 1n]).toEqual([0n, 0n]);
    }
  });

  describe('through QMP, with the daemon stopped', () => {
    let qmpA: QmpClient;
    let qmpB: QmpClient;
    beforeAll(async () => {
      await rt.stop();
      [qmpA, qmpB] = await Promise.all([
        connectQmp(path.join(infoA.confinement!.vmmDir!, 'qmp.sock')),
        connectQmp(path.join(infoB.workDir, 'qmp.sock')),
      ]);
    });
    afterAll(async () => {
      qmpA?.close();
      qmpB?.close();
    });

    const open = (qmp: QmpClient, filename: string, node: string) =>
      qmp.execute('blockdev-add', { driver: 'file', 'node-name': node, filename, 'read-only': true }).then(
        () => 'opened',
        (err: Error) => err.message,
      );

    it("A cannot open a host file, B's work dir or /etc/hostname; it opens its own guest image; B opens the host file", async () => {
      const denied = [hostFile(), path.join(infoB.workDir, 'console.log'), '/etc/hostname'];
      for (const [i, file] of denied.entries())
        expect([file, await open(qmpA, file, `n${i}`)]).toEqual([file, expect.stringMatching(/No such file|Permission denied/)]);
      const image =
        JSON.parse(await fsp.readFile(rt.configPath, 'utf8')).hypervisor.guestImagePath ?? '/usr/local/share/kata-ts/guest/guest.img';
      expect(await open(qmpA, image, 'own')).toBe('opened');
      expect(await open(qmpB, hostFile(), 'control')).toBe('opened');
      await qmpB.execute('blockdev-del', { 'node-name': 'control' });
      await qmpA.execute('blockdev-del', { 'node-name': 'own' });
    });

    it(
      'A hot-plugs a PCIe device onto a reserved port and a vCPU, and grows by virtio-mem',
      async () => {
        await qmpA.deviceAdd({ driver: 'e1000e', id: 'hotnic', bus: 'rp0' });
        const pci = JSON.stringify(await qmpA.queryPci());
        expect(pci).toContain('"qdev_id":"hotnic"');
        const before = (await qmpA.queryCpusFast()).length;
        if (infoA.shape.maxVcpus > infoA.shape.vcpus) {
          await plugVcpus(qmpA, 1);
          expect((await qmpA.queryCpusFast()).length).toBe(before + 1);
        }
        const headroom = infoA.shape.maxMemoryMiB - infoA.shape.memoryMiB;
        expect(headroom).toBeGreaterThanOrEqual(128);
        await setVirtioMemSize(qmpA, 128, headroom);
        await untilMatches(
          'virtio-mem plugged',
          () => virtioMemPluggedMiB(qmpA),
          (m) => m === 128,
          60_000,
        );
      },
      scaledMs(90_000),
    );
  });

  it(
    'a restart finds both again: B put back to format 5 (a root QEMU from before this change) and the confined A',
    async () => {
      const file = path.join(rt.stateDir, 'sandboxes', `${b}.json`);
      const envelope = JSON.parse(await fsp.readFile(file, 'utf8'));
      delete envelope.record.confinement;
      delete envelope.record.plan.vmm;
      envelope.version = 5;
      await fsp.writeFile(file, JSON.stringify(envelope));
      await fsp.rm(infoA.confinement!.identity!.lease); // as after a reboot emptied it: written again
      await rt.start();
      const { items } = await rt.cri.runtime.ListPodSandbox({});
      expect(items.map((s) => [s.id, s.state]).sort()).toEqual(
        [
          [a, 'SANDBOX_READY'],
          [b, 'SANDBOX_READY'],
        ].sort(),
      );
      const [againA, againB] = await Promise.all([info(a), info(b)]);
      expect([againA.pid, againB.pid]).toEqual([infoA.pid, infoB.pid]);
      expect(againA.confinement).toEqual(infoA.confinement);
      expect(againB.confinement).toBeNull();
      // Written back in the current format.
      expect(JSON.parse(await fsp.readFile(file, 'utf8')).version).toBe(SANDBOX_RECORD_VERSION);
      expect(JSON.parse(await fsp.readFile(infoA.confinement!.identity!.lease, 'utf8'))).toMatchObject({ sandboxId: a });
    },
    scaledMs(120_000),
  );

  it(
    'remove gives the identity back (quarantined) and leaves nothing: no jail mount, held lease, work dir or process',
    async () => {
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: a });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: b });
      // Given back into quarantine: the lease names no sandbox any more, only when it was released.
      const mark = JSON.parse(await fsp.readFile(infoA.confinement!.identity!.lease, 'utf8')) as Record<string, unknown>;
      expect(Object.keys(mark)).toEqual(['releasedAtMs']);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(rt.stateDir);
      expect(await rt.mountinfo()).not.toContain(path.join(rt.stateDir, 'vm'));
      // The VMMs' own cgroups (the test's private root, which both pods' parents share, goes with cleanup()).
      expect(await leftovers(rt, { vmmCgroupsOnly: true })).toEqual(NOTHING);
      const host = await fsp.stat(path.join(FIXTURE, 'dev', 'vfio', '12'));
      expect(host.uid).toBe(0);
    },
    scaledMs(120_000),
  );
});
