/**
 * Starts a bare q35 QEMU (no guest kernel, no disk) with a planned PCIe topology, paused (-S),
 * with QMP on a unix socket in a private temporary directory; stops it by PID.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectQmp, type QmpClient } from '../../src/hypervisor/qmp/client.js';
import type { QmpPciDevice } from '../../src/hypervisor/qmp/types.js';

export interface BareQemu {
  pid: number;
  qmp: QmpClient;
  /**
   * Resolves once SeaBIOS has finished PCI init: `done` when it went on to boot ("All threads
   * complete."), `out-of-32bit` when it halted because the windows did not fit below 4 GiB.
   */
  firmwarePciInit(timeoutMs?: number): Promise<'done' | 'out-of-32bit'>;
  /** stderr so far, for assertion messages. */
  stderr(): string;
  /** Close QMP, SIGKILL the QEMU this helper started (by PID), remove the directory. Idempotent. */
  stop(): Promise<void>;
}

const QEMU = process.env.KATA_TS_QEMU ?? 'qemu-system-x86_64';

export async function startBareQemu(deviceArgs: readonly string[]): Promise<BareQemu> {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kpcie-'));
  const sock = path.join(dir, 'qmp.sock');
  const fwLog = path.join(dir, 'firmware.log');
  // SeaBIOS prints its progress on the debug port 0x402; that is how a test knows the firmware
  // has numbered the buses and programmed the windows (query-pci alone cannot tell).
  const argv = [
    '-machine',
    'q35',
    '-nodefaults',
    '-display',
    'none',
    '-S',
    '-accel',
    'tcg',
    '-m',
    '512',
    '-qmp',
    `unix:${sock},server=on,wait=off`,
    '-debugcon',
    `file:${fwLog}`,
    '-global',
    'isa-debugcon.iobase=0x402',
    ...deviceArgs,
  ];
  const child: ChildProcess = spawn(QEMU, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let qmp: QmpClient | undefined;
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    qmp?.close();
    if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
    await exited;
    await fsp.rm(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`QEMU exited (${child.exitCode}): ${err}`);
      try {
        qmp = await connectQmp(sock, { timeoutMs: 20_000 });
        break;
      } catch (e) {
        if (i > 200) throw e;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  } catch (e) {
    await stop();
    throw e;
  }
  const firmwarePciInit = async (timeoutMs = 120_000): Promise<'done' | 'out-of-32bit'> => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const log = await fsp.readFile(fwLog, 'utf8').catch(() => '');
      if (log.includes('PCI: out of 32bit address space')) return 'out-of-32bit';
      if (log.includes('All threads complete.')) return 'done';
      if (Date.now() > deadline) throw new Error(`SeaBIOS did not finish PCI init within ${timeoutMs} ms; log tail: ${log.slice(-500)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  return { pid: child.pid!, qmp, stderr: () => err, firmwarePciInit, stop };
}

/** A device as query-pci shows it, with the qdev id of the bridge whose secondary bus holds it. */
export interface PciNode {
  dev: QmpPciDevice;
  parent: string;
}

/** Flatten query-pci's tree: every device with its parent bridge's qdev id (`pcie.0` for bus 0). */
export function flattenPci(devices: readonly QmpPciDevice[], parent = 'pcie.0', out: PciNode[] = []): PciNode[] {
  for (const dev of devices) {
    out.push({ dev, parent });
    if (dev.pci_bridge?.devices) flattenPci(dev.pci_bridge.devices, dev.qdev_id, out);
  }
  return out;
}
