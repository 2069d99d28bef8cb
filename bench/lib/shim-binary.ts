/**
 * kata-ts's shim as containerd finds it for a bench: a `containerd-shim-kata-ts-v2` on containerd's
 * PATH that runs bin/containerd-shim-kata-ts-v2 with the bench's config, on the compiled code
 * (dist/, what a node runs) when it is fresh, else on the sources through tsx; and, when asked, GNU
 * time around `start` and `delete` for their peak RSS and wall time.
 */
import { existsSync, promises as fsp, readdirSync, statSync } from 'node:fs';
import path from 'node:path';

/** Which code the shim runs: `dist` (compiled) or `tsx` (the sources, transpiled at every start). */
export type ShimCode = 'dist' | 'tsx';

/** GNU time, for the peak RSS of a `start` (Debian's `time` package; without it none is measured). */
export const GNU_TIME = '/usr/bin/time';

function tsSources(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...tsSources(p));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/**
 * Whether dist/ holds a build of every source in src/ that is at least as new as the source
 * (`npm run build` makes it); null when fresh, else why not (the first stale or missing file).
 */
export function distStaleness(root: string): string | null {
  const src = path.join(root, 'src');
  const dist = path.join(root, 'dist');
  if (!existsSync(path.join(dist, 'shim', 'main.js'))) return 'dist/shim/main.js is missing';
  for (const file of tsSources(src)) {
    const rel = path.relative(src, file).replace(/\.ts$/, '.js');
    const built = path.join(dist, rel);
    if (!existsSync(built)) return `dist/${rel} is missing`;
    if (statSync(built).mtimeMs < statSync(file).mtimeMs) return `src/${path.relative(src, file)} is newer than dist/${rel}`;
  }
  return null;
}

const sh = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`;

export interface ShimWrapperOptions {
  /** The directory to put `containerd-shim-kata-ts-v2` in (containerd's shimBinDir). */
  binDir: string;
  /** The kata-ts package root (bin/containerd-shim-kata-ts-v2 lives there). */
  root: string;
  /** KATA_TS_CONFIG for the shim. */
  configPath: string;
  code: ShimCode;
  /**
   * While this file exists (and GNU time is installed), each `start` and `delete` runs under GNU
   * time, which appends `<max RSS KiB> <elapsed s> <command line>` to `peakFile`. `serve` is never
   * wrapped.
   */
  peakFlagFile: string;
  peakFile: string;
  /** Through the native start front (dist/native/kata-ts-shim-start), which execs the Node shim when it does not answer itself. */
  front?: boolean;
}

/** Writes the wrapper script; answers its path. */
export async function writeShimWrapper(o: ShimWrapperOptions): Promise<string> {
  const node = sh(process.execPath);
  const bin = sh(path.join(o.root, 'bin', 'containerd-shim-kata-ts-v2'));
  // The front takes the Node shim's command line, then `--` and containerd's arguments.
  const shim = o.front === true ? `${sh(path.join(o.root, 'dist', 'native', 'kata-ts-shim-start'))} ${node} ${bin} --` : `${node} ${bin}`;
  const file = path.join(o.binDir, 'containerd-shim-kata-ts-v2');
  await fsp.mkdir(o.binDir, { recursive: true });
  await fsp.writeFile(
    file,
    [
      '#!/bin/sh',
      '# Written by a kata-ts bench (bench/lib/shim-binary.ts): exec, so the pid containerd sees is the shim.',
      `export KATA_TS_CONFIG=${sh(o.configPath)}`,
      o.code === 'tsx' ? 'export KATA_TS_SHIM_TSX=1' : 'unset KATA_TS_SHIM_TSX',
      'for last in "$@"; do :; done',
      `if { [ "$last" = start ] || [ "$last" = delete ]; } && [ -e ${sh(o.peakFlagFile)} ] && [ -x ${GNU_TIME} ]; then`,
      `  exec ${GNU_TIME} -a -o ${sh(o.peakFile)} -f '%M %e %C' ${shim} "$@"`,
      'fi',
      `exec ${shim} "$@"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  return file;
}

/** What GNU time recorded of one shim invocation. */
export interface ShimRun {
  action: 'start' | 'delete';
  /** The task id (`-id`). */
  id: string;
  maxRssKiB: number;
  elapsedMs: number;
}

/** Each `start` and `delete` GNU time recorded, in order. */
export async function readShimRuns(peakFile: string): Promise<ShimRun[]> {
  const text = await fsp.readFile(peakFile, 'utf8').catch(() => '');
  const out: ShimRun[] = [];
  for (const line of text.split('\n')) {
    const m = /^(\d+) ([\d.]+) (.*) (start|delete)$/.exec(line);
    if (m === null) continue; // e.g. GNU time's "Command exited with non-zero status N"
    const id = / -id (\S+)/.exec(` ${m[3]}`)?.[1];
    if (id !== undefined) out.push({ action: m[4] as ShimRun['action'], id, maxRssKiB: Number(m[1]), elapsedMs: Number(m[2]) * 1000 });
  }
  return out;
}
