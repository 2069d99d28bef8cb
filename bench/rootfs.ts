/**
 * Container root filesystems: the old copy (`cp -a --reflink=auto` of the flat image) against an
 * overlay of the image's shared layers, side by side in one run.
 *
 * 1. The rootfs step of CreateContainer (createContainerRootfs, what the rest of CreateContainer
 *    does not depend on the image's size for) and the host disk it takes, for a ~100 MB and a
 *    ~1 GB image, each mode's store pulled from a loopback docker-registry; per mode the ratio
 *    1 GB / 100 MB (goal for the overlay: <= 1.2; the copy's is about the ratio of the sizes).
 * 2. Two images sharing a ~500 MB base layer pulled into each store: the disk their unpacked
 *    trees take (flat trees per image against layers once).
 *
 * The images are generated here (files of pseudo-random bytes, uncompressed layers). The bench
 * runs itself inside a private mount namespace (unshare), so its overlays never reach the host's
 * mount table, even if it is killed. Rounds alternate which mode goes first. Nothing is asserted.
 *
 *   node --import tsx bench/rootfs.ts [--rounds N] [--small-mib M] [--large-mib M] [--base-mib M] [--json]
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/common/logger.js';
import { containerRootfsDirs } from '../src/images/overlay-plan.js';
import { createContainerRootfs, removeContainerRootfs, removeContainerSnapshot } from '../src/images/rootfs.js';
import { ImageService } from '../src/images/service.js';
import { diskUsage } from '../src/images/store/usage.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from '../test/helpers/images-builder.js';
import { startRegistry } from '../test/helpers/images-registry.js';
import type { TarEntrySpec } from '../test/helpers/images-tar.js';
import { median } from './lib/proc.js';

const MARK = 'KATA_TS_BENCH_ROOTFS_NS';
const MiB = 1024 * 1024;
type Mode = 'copy' | 'overlay';
const MODES: Mode[] = ['copy', 'overlay'];

/** `mib` MiB of 1 MiB files with distinct contents under `dir/`. */
function dataEntries(dir: string, mib: number): TarEntrySpec[] {
  const block = randomBytes(MiB);
  return [
    { name: `${dir}/`, type: 'directory' },
    ...Array.from({ length: mib }, (_, i): TarEntrySpec => {
      const content = Buffer.from(block);
      content.writeUInt32BE(i, 0);
      return { name: `${dir}/f${i}`, content };
    }),
  ];
}

async function storeOf(stateDir: string, registries: string, mode: Mode): Promise<ImageService> {
  const svc = new ImageService({
    stateDir,
    registriesConfigPath: registries,
    logger: silentLogger(),
    isImageInUse: () => false,
    rootfsMode: mode,
  });
  await svc.init();
  if (svc.rootfsMode.mode !== mode) throw new Error(`${mode} mode unavailable here: ${svc.rootfsMode.reason}`);
  return svc;
}

/** Disk a container's root filesystem takes: the copy, or the overlay's upper, work and links (not the mount). */
async function takenBytes(dir: string, overlay: boolean): Promise<number> {
  if (!overlay) return (await diskUsage(dir)).usedBytes;
  const d = containerRootfsDirs(dir);
  let n = 0;
  for (const p of [d.upper, d.work, d.links]) n += (await diskUsage(p)).usedBytes;
  return n + (await fsp.stat(dir)).blocks * 512 + (await fsp.stat(d.merged)).blocks * 512;
}

export interface RootfsBenchResult {
  rounds: number;
  sizesMiB: { small: number; large: number; base: number };
  createMs: Record<Mode, { small: number[]; large: number[] }>;
  takenBytes: Record<Mode, { small: number; large: number }>;
  sharedBaseUnpackedBytes: Record<Mode, number>;
}

export async function runRootfsBench(
  opts: { rounds: number; smallMiB: number; largeMiB: number; baseMiB: number },
  progress: (l: string) => void = (l) => process.stderr.write(`${l}\n`),
): Promise<RootfsBenchResult> {
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-bench-rootfs-'));
  const registry = await startRegistry();
  const services: ImageService[] = [];
  try {
    const registries = path.join(work, 'registries.json');
    await fsp.writeFile(registries, JSON.stringify({ registries: { '127.0.0.1:*': { plainHttp: true } } }));
    const pusher = new RegistryPusher(registry.url);
    const base = { entries: busyboxBaseEntries(), compression: 'none' as const };
    const refs: Record<string, string> = {};
    const ids: Record<string, string> = {};
    // One image at a time: a 1 GB layer is built, pushed and dropped before the next.
    for (const [name, layers] of [
      ['small', [base, { entries: dataEntries('data', opts.smallMiB), compression: 'none' as const }]],
      ['large', [base, { entries: dataEntries('data', opts.largeMiB), compression: 'none' as const }]],
    ] as const) {
      progress(`building and pushing the ${name} image`);
      const built = await buildImage({ layers: [...layers], label: name });
      await pusher.pushImage(`bench/${name}`, '1', built);
      refs[name] = `${registry.host}/bench/${name}:1`;
      ids[name] = built.id;
    }
    progress('building and pushing two images on a shared base layer');
    const shared = { entries: dataEntries('base', opts.baseMiB), compression: 'none' as const };
    for (const name of ['app1', 'app2']) {
      const built = await buildImage({
        layers: [shared, { entries: [{ name: `${name}.txt`, content: name }], compression: 'none' }],
        label: name,
      });
      await pusher.pushImage(`bench/${name}`, '1', built);
      refs[name] = `${registry.host}/bench/${name}:1`;
    }

    const stores = {} as Record<Mode, ImageService>;
    const sharedBaseUnpackedBytes = {} as Record<Mode, number>;
    for (const mode of MODES) {
      const stateDir = path.join(work, mode);
      stores[mode] = await storeOf(stateDir, registries, mode);
      services.push(stores[mode]);
      progress(`pulling into the ${mode} store`);
      for (const name of ['small', 'large']) await stores[mode].pullImage({ image: { image: refs[name] as string } });
      // The shared-base pair in a store of its own, so its disk is counted alone.
      const pairDir = path.join(work, `${mode}-pair`);
      const pair = await storeOf(pairDir, registries, mode);
      services.push(pair);
      for (const name of ['app1', 'app2']) await pair.pullImage({ image: { image: refs[name] as string } });
      const unpacked = mode === 'copy' ? pair.rootfsDir : pair.layers.dir;
      sharedBaseUnpackedBytes[mode] = (await diskUsage(unpacked)).usedBytes;
    }

    const createMs: RootfsBenchResult['createMs'] = { copy: { small: [], large: [] }, overlay: { small: [], large: [] } };
    const taken: RootfsBenchResult['takenBytes'] = { copy: { small: 0, large: 0 }, overlay: { small: 0, large: 0 } };
    let n = 0;
    for (let round = 0; round < opts.rounds; round++) {
      const order = round % 2 === 0 ? MODES : [...MODES].reverse();
      for (const size of ['small', 'large'] as const) {
        for (const mode of order) {
          const dir = path.join(work, 'containers', `c${n++}`);
          const source = stores[mode].rootfsSourceFor(ids[size] as string);
          const t0 = performance.now();
          const made = await createContainerRootfs(source, dir);
          createMs[mode][size].push(performance.now() - t0);
          taken[mode][size] = await takenBytes(dir, made.overlay !== null);
          if (made.overlay !== null) await removeContainerRootfs(made.overlay);
          else await removeContainerSnapshot(dir);
        }
      }
      progress(`round ${round + 1}/${opts.rounds} done`);
    }
    return {
      rounds: opts.rounds,
      sizesMiB: { small: opts.smallMiB, large: opts.largeMiB, base: opts.baseMiB },
      createMs,
      takenBytes: taken,
      sharedBaseUnpackedBytes,
    };
  } finally {
    for (const s of services) s.close();
    await registry.stop();
    await fsp.rm(work, { recursive: true, force: true });
  }
}

function report(r: RootfsBenchResult): string {
  const mb = (b: number): string => (b / 1e6).toFixed(1);
  const ms = (v: number): string => v.toFixed(1);
  const lines = [
    `rootfs step of CreateContainer, ${r.rounds} rounds, medians (image ~${r.sizesMiB.small} MiB vs ~${r.sizesMiB.large} MiB of data):`,
  ];
  lines.push('mode      small ms   large ms   large/small   disk small MB   disk large MB');
  for (const mode of MODES) {
    const s = median(r.createMs[mode].small);
    const l = median(r.createMs[mode].large);
    lines.push(
      `${mode.padEnd(9)} ${ms(s).padStart(8)}   ${ms(l).padStart(8)}   ${(l / s).toFixed(2).padStart(11)}   ${mb(r.takenBytes[mode].small).padStart(13)}   ${mb(r.takenBytes[mode].large).padStart(13)}`,
    );
  }
  const ratio = median(r.createMs.overlay.large) / median(r.createMs.overlay.small);
  lines.push(`goal: overlay large/small <= 1.2: ${ratio <= 1.2 ? 'met' : 'not met'} (${ratio.toFixed(2)})`);
  lines.push(
    `overlay vs copy, large image: ${(median(r.createMs.overlay.large) / median(r.createMs.copy.large)).toFixed(3)}x the time, ${(r.takenBytes.overlay.large / Math.max(1, r.takenBytes.copy.large)).toFixed(5)}x the disk`,
  );
  lines.push(
    `two images on a ~${r.sizesMiB.base} MiB shared base, unpacked on disk: copy (flat tree per image) ${mb(r.sharedBaseUnpackedBytes.copy)} MB, overlay (layers once) ${mb(r.sharedBaseUnpackedBytes.overlay)} MB, ratio ${(r.sharedBaseUnpackedBytes.overlay / r.sharedBaseUnpackedBytes.copy).toFixed(2)}`,
  );
  return lines.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '3' },
      'small-mib': { type: 'string', default: '100' },
      'large-mib': { type: 'string', default: '1000' },
      'base-mib': { type: 'string', default: '500' },
      json: { type: 'boolean', default: false },
    },
  });
  if (process.env[MARK] !== '1') {
    // Again inside a private mount namespace: the overlays stay there, and go with it.
    const r = spawnSync(
      'unshare',
      ['--mount', '--propagation', 'private', '--', process.execPath, ...process.execArgv, ...process.argv.slice(1)],
      {
        stdio: 'inherit',
        env: { ...process.env, [MARK]: '1' },
      },
    );
    process.exit(r.status ?? 1);
  }
  const result = await runRootfsBench({
    rounds: Number(values.rounds),
    smallMiB: Number(values['small-mib']),
    largeMiB: Number(values['large-mib']),
    baseMiB: Number(values['base-mib']),
  });
  process.stdout.write(values.json ? `${JSON.stringify({ bench: 'rootfs', ...result })}\n` : `${report(result)}\n`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
}
