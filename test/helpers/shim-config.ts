/**
 * kata-ts's shim as the tests (and bench/shim.ts) install it for a containerd or a CRI-O of their
 * own: its config file (a state root, cgroupfs, no CNI of its own, the test's guest) and a wrapper
 * named `containerd-shim-kata-ts-v2` that runs the repo's sources with that config.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';
import { guestDirConfig } from './runtime-daemon.js';
import { scaledMs } from './time-scale.js';

/** The shim's config document: `extra` (top-level keys) over what every test shim shares. */
export function shimTestConfig(dir: string, stateRoot: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    stateDir: path.join(dir, 'unused-state'),
    socketPath: path.join(dir, 'unused.sock'),
    metricsAddress: null,
    cgroupDriver: 'cgroupfs',
    logLevel: 'debug',
    // containerd (or CRI-O) runs CNI; the shim joins the namespace it made.
    network: { mode: 'none' },
    shim: { stateRoot },
    // The runtime's 90 s boot bound is sized for an idle machine; the tests' bounds all scale.
    hypervisor: { readyTimeoutMs: scaledMs(90_000), ...guestDirConfig() },
    ...extra,
  };
}

/**
 * Write the config to `configPath` and, at `binary`, a wrapper that runs the repo's shim sources
 * (through tsx) with it; with `compiled`, the repo's compiled shim (dist/, `npm run build`) instead,
 * which starts in a fraction of tsx's time (containerd gives `shim delete` a few seconds).
 */
export async function installTestShim(
  binary: string,
  configPath: string,
  config: Record<string, unknown>,
  compiled = false,
): Promise<void> {
  await fsp.writeFile(configPath, JSON.stringify(config));
  await fsp.mkdir(path.dirname(binary), { recursive: true });
  await fsp.writeFile(
    binary,
    [
      '#!/bin/sh',
      `export KATA_TS_CONFIG=${configPath}`,
      ...(compiled ? [] : ['export KATA_TS_SHIM_TSX=1']),
      `exec ${process.execPath} ${path.join(packageRoot(), 'bin', 'containerd-shim-kata-ts-v2')} "$@"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
}
