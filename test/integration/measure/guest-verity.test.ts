/**
 * The guest image is measured on a TEE pod, proved by attack. kata-ts's guest (kernel, initramfs
 * with guest/init, the kata-ts-verity helper and the dm-verity modules, guest.img with the real
 * agent and its dm-verity tree) is built by scripts/build-guest.sh into this test's own cache
 * (KATA_TS_VERITY_GUEST_DIR, default the tests' agent guest: test/helpers/agent-guest.ts), never the installed guest, and a
 * real `kata-ts serve` boots `kata-ts-cvm` pods (vtpm here: OVMF, swtpm, TCG) from it:
 *
 * 1. the pod boots and a container runs; its measured command line (-append) carries
 *    `kata_ts.verity=` with the root hash build-guest.sh wrote; the guest's erofs /usr sits on
 *    the device-mapper device `kata-ts-usr` (sysfs, read from the container), not on the raw disk,
 *    and init's console line says so; the guest's PCRs 4, 7, 8 and 9 equal the prediction (PCR 9
 *    measured that command line);
 * 2. the daemon restarts on a copy of guest.img with one byte of the agent's start-up snapshot
 *    (lib/kata-ts/agent.blob, which node reads whole when the agent starts) flipped inside the erofs
 *    data, beside the same verity metadata: QEMU gets exactly the same -append (the measurement
 *    does not move), the guest's dm-verity refuses that very block (its error in the guest's
 *    console) and restarts the VM, which QEMU (-no-reboot) ends; the agent never answers, the
 *    pod never becomes ready and nothing of it is left.
 *
 * Two VM boots. The daemon, its VMs, swtpm and the temporary directories go, pass or fail.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readGuestImageVerity, verityKernelParam } from '../../../src/hypervisor/guest-verity.js';
import { agentGuestDir } from '../../helpers/agent-guest.js';
import { processesMentioning } from '../../helpers/hypervisor-guest.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../../helpers/images-builder.js';
import { type RegistryHandle, startRegistry } from '../../helpers/images-registry.js';
import { createTestRuntime, leftovers, podConfig, type TestRuntime } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const GUEST_DIR = process.env.KATA_TS_VERITY_GUEST_DIR ?? agentGuestDir();
const HANDLER = 'kata-ts-cvm';
const NOTHING = { processes: [], workDirs: [], records: [], cgroups: [] };

interface Info {
  workDir: string;
  tee: { kind: string };
  plan: { qemu: { argv: string[] }; tee: { guestImage: { path: string; verity: unknown } | null } };
  referenceValues: { vtpm?: { pcrs: Record<string, string> } } | null;
}

const appendOf = (argv: readonly string[]): string => argv[argv.indexOf('-append') + 1] ?? '';

/** The physical byte offset of a file's first extent in an erofs image (dump.erofs, from erofs-utils). */
function firstExtentOffset(image: string, file: string): { offset: number; length: number } {
  const out = execFileSync('dump.erofs', ['-e', `--path=${file}`, image], { encoding: 'utf8' });
  // " 0:        0.. 5914624 | 5914624 :   86843392..  92758016 | 5914624"
  const m = /^\s*0:\s+0\.\.\s*\d+\s*\|\s*(\d+)\s*:\s*(\d+)\.\./m.exec(out);
  if (m === null) throw new Error(`dump.erofs gave no extent for ${file}:\n${out}`);
  return { length: Number(m[1]), offset: Number(m[2]) };
}

/** Every console.log under a directory (the failing pod's work dir, while it exists). */
async function consoleLogsUnder(dir: string): Promise<string[]> {
  const found: string[] = [];
  const walk = async (d: string): Promise<void> => {
    for (const e of await fsp.readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.name === 'console.log') found.push(p);
    }
  };
  await walk(dir);
  return found;
}

describe('the guest image on a TEE pod: verified by dm-verity against the root hash on the measured command line', () => {
  let rt: TestRuntime;
  let registry: RegistryHandle;
  let tamperDir = '';
  let image = '';
  let sid = '';
  let cid = '';
  let first: Info;

  const info = async (id: string): Promise<Info> => {
    const r = await rt.cri.runtime.PodSandboxStatus({ pod_sandbox_id: id, verbose: true });
    return JSON.parse(r.info.info!) as Info;
  };
  const exec = async (cmd: string[]) => {
    const r = await rt.cri.runtime.ExecSync({ container_id: cid, cmd, timeout: 30 });
    return { code: r.exit_code, out: Buffer.from(r.stdout).toString('utf8').trim() };
  };
  const setHypervisor = async (hypervisor: Record<string, unknown>): Promise<void> => {
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    cfg.hypervisor = { ...(cfg.hypervisor as object), ...hypervisor };
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
  };

  beforeAll(async () => {
    execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', GUEST_DIR], { stdio: ['ignore', 'ignore', 'inherit'] });
    registry = await startRegistry();
    const built = await buildImage({ layers: [{ entries: busyboxBaseEntries(), compression: 'gzip' }], cmd: ['/bin/sh'] });
    await new RegistryPusher(registry.url).pushImage('kata/verity', '1.0', built);
    image = `${registry.host}/kata/verity:1.0`;
    rt = await createTestRuntime({
      hypervisor: {
        kernelPath: path.join(GUEST_DIR, 'vmlinuz'),
        initrdPath: path.join(GUEST_DIR, 'initramfs.cpio.gz'),
        guestImagePath: path.join(GUEST_DIR, 'guest.img'),
      },
    });
    const registries = path.join(rt.dir, 'registries.json');
    await fsp.writeFile(registries, JSON.stringify({ registries: { '127.0.0.1:*': { plainHttp: true } } }));
    const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as Record<string, unknown>;
    cfg.images = { registriesConfigPath: registries };
    await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
    await rt.start();
    await rt.cri.image.PullImage({ image: { image } });
    const config = podConfig(rt, 'verity');
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
  }, scaledMs(600_000));

  afterAll(async () => {
    await rt?.cleanup();
    await registry?.stop();
    if (tamperDir !== '') await fsp.rm(tamperDir, { recursive: true, force: true });
  });

  it("the pod's measured -append carries the root hash build-guest.sh wrote, and the plan names the verified image", async () => {
    const verity = await readGuestImageVerity(path.join(GUEST_DIR, 'guest.img'));
    expect(verity).not.toBeNull();
    expect(first.tee.kind).toBe('vtpm');
    expect(appendOf(first.plan.qemu.argv).split(' ')).toContain(verityKernelParam(verity!));
    expect(first.plan.tee.guestImage).toEqual({ path: path.join(GUEST_DIR, 'guest.img'), verity });
  });

  it("the guest's /usr is erofs on the dm-verity device, not on the raw disk, and the container runs", async () => {
    // erofs registers each mount in sysfs under its block device's name.
    const erofs = (await exec(['ls', '/sys/fs/erofs'])).out.split(/\s+/).filter((n) => n !== 'features');
    expect(erofs).toEqual(['dm-0']);
    expect(await exec(['cat', '/sys/block/dm-0/dm/name'])).toEqual({ code: 0, out: 'kata-ts-usr' });
    expect((await exec(['cat', '/sys/block/dm-0/ro'])).out).toBe('1');
    // The mapping reads the virtio-blk disk whose serial is the guest image's.
    const slaves = (await exec(['ls', '/sys/block/dm-0/slaves'])).out.split(/\s+/);
    expect(slaves).toHaveLength(1);
    expect(await exec(['cat', `/sys/block/${slaves[0]}/serial`])).toEqual({ code: 0, out: 'kata-ts-guest' });
    const consoleText = readFileSync(await consoleLogsUnder(first.workDir).then((l) => l[0]!), 'utf8');
    expect(consoleText).toMatch(
      /kata-ts-init: the guest image \/dev\/vd[a-z] is mounted at \/usr through dm-verity \(\/dev\/mapper\/kata-ts-usr/,
    );
  });

  it("the guest's PCRs 4, 7, 8 and 9 equal the values predicted before boot from that command line", async () => {
    const pcrs = first.referenceValues?.vtpm?.pcrs ?? {};
    expect(Object.keys(pcrs)).toEqual(['4', '7', '8', '9']);
    for (const [pcr, value] of Object.entries(pcrs)) {
      const read = await exec(['cat', `/sys/class/tpm/tpm0/pcr-sha256/${pcr}`]);
      expect({ pcr, value: read.out.toLowerCase() }).toEqual({ pcr, value });
    }
  });

  it(
    'a guest image with one byte of the agent changed, same metadata: the same measured command line, and the pod never runs',
    async () => {
      await rt.cri.runtime.StopPodSandbox({ pod_sandbox_id: sid });
      await rt.cri.runtime.RemovePodSandbox({ pod_sandbox_id: sid });
      expect(await leftovers(rt, { vmmCgroupsOnly: true })).toEqual(NOTHING);

      // The host's attack: a copy of guest.img with one byte of agent.blob flipped, inside the
      // erofs data the tree covers, and the genuine metadata beside it.
      tamperDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kts-verity-'));
      const original = path.join(GUEST_DIR, 'guest.img');
      const tampered = path.join(tamperDir, 'guest.img');
      await fsp.copyFile(original, tampered);
      await fsp.copyFile(`${original}.verity.json`, `${tampered}.verity.json`);
      const verity = (await readGuestImageVerity(original))!;
      const blob = firstExtentOffset(tampered, '/lib/kata-ts/agent.blob');
      const at = blob.offset + 4096 * 3 + 123;
      expect(at + 1).toBeLessThan(Math.min(blob.offset + blob.length, verity.dataBlocks * 4096));
      const handle = await fsp.open(tampered, 'r+');
      const byte = Buffer.alloc(1);
      await handle.read(byte, 0, 1, at);
      byte[0] = (byte[0] ?? 0) ^ 0x01;
      await handle.write(byte, 0, 1, at);
      await handle.close();
      const digest = async (f: string) =>
        createHash('sha256')
          .update(await fsp.readFile(f))
          .digest('hex');
      expect(await digest(tampered)).not.toBe(await digest(original));
      expect(await readGuestImageVerity(tampered)).toEqual(verity);

      // A second daemon on it; a shorter budget, as the agent of that guest never answers.
      await setHypervisor({ guestImagePath: tampered, readyTimeoutMs: 60_000 });
      await rt.restart();
      let append = '';
      let consoleText = '';
      let done = false;
      const watch = (async () => {
        // What QEMU was started with, and the guest's console while the pod's dir exists.
        while (!done) {
          for (const pid of processesMentioning(tampered)) {
            const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
            if (argv.includes('-append')) append = appendOf(argv);
          }
          for (const log of await consoleLogsUnder(path.join(rt.stateDir, 'vm'))) {
            const text = await fsp.readFile(log, 'utf8').catch(() => '');
            if (text.length >= consoleText.length) consoleText = text;
          }
          await new Promise((r) => setTimeout(r, 200));
        }
      })();
      const run = await rt.cri.runtime.RunPodSandbox({ config: podConfig(rt, 'tampered'), runtime_handler: HANDLER }).then(
        () => 'ran',
        (err: Error) => err.message,
      );
      done = true;
      await watch;

      expect(run).not.toBe('ran');
      // The measured command line is exactly the genuine pod's: a verifier sees nothing moved.
      expect(append).toBe(appendOf(first.plan.qemu.argv));
      // The guest mounted /usr through dm-verity, which refused the changed block.
      expect(consoleText).toContain('mounted at /usr through dm-verity');
      // The very block changed, then the restart verity.c asked for (QEMU, -no-reboot, exits).
      expect(consoleText).toMatch(new RegExp(`device-mapper: verity: [0-9]+:[0-9]+: data block ${Math.floor(at / 4096)} is corrupted`));
      expect(consoleText).toContain("reboot: Restarting system with command 'dm-verity device corrupted'");
      expect(consoleText).not.toMatch(/agent serving/);
      expect((await rt.cri.runtime.ListPodSandbox({})).items).toEqual([]);
      expect(await leftovers(rt, { vmmCgroupsOnly: true })).toEqual(NOTHING);
    },
    scaledMs(300_000),
  );
});
