/**
 * What the kata-ts guest init (guest/init) tells the host on its virtio-serial port, one line per
 * message, space-separated `key=value` fields after a keyword:
 *
 *   KATA_TS_READY vcpus=2 memory_kib=399348 online_memory_kib=524288 kernel=6.1.0-56-amd64
 *       once, when the guest is up (modules loaded, CPUs online, port found);
 *   KATA_TS_UPDATE vcpus=3 memory_kib=661492 online_memory_kib=786432
 *       whenever one of those values changes (CPU hot-plug onlined, virtio-mem grew or shrank),
 *       polled once a second;
 *   KATA_TS_POWEROFF
 *       the power button was pressed (QMP system_powerdown) and the guest is powering off.
 *
 * `vcpus` counts online CPUs; `memory_kib` is MemTotal (RAM minus what the kernel reserved);
 * `online_memory_kib` is online memory blocks times the block size, i.e. boot RAM plus hot-plugged
 * memory in memory-block (128 MiB) granularity. Unknown keys are ignored, so fields can be added.
 */

/** The name of the virtio-serial port the guest reports on (`name=` of the virtserialport). */
export const READY_PORT_NAME = 'org.kata-ts.ready';

export interface GuestReport {
  kind: 'ready' | 'update';
  vcpus: number;
  memoryKiB: number;
  onlineMemoryKiB: number;
  /** `uname -r`, sent with the ready line only. */
  kernelRelease?: string;
}

export type GuestMessage = GuestReport | { kind: 'poweroff' };

/** Parse one line from the guest; undefined for a line that is not part of the protocol. */
export function parseGuestLine(line: string): GuestMessage | undefined {
  const [keyword, ...rest] = line.trim().split(/\s+/);
  if (keyword === 'KATA_TS_POWEROFF') return { kind: 'poweroff' };
  if (keyword !== 'KATA_TS_READY' && keyword !== 'KATA_TS_UPDATE') return undefined;
  const fields = new Map<string, string>();
  for (const token of rest) {
    const eq = token.indexOf('=');
    if (eq > 0) fields.set(token.slice(0, eq), token.slice(eq + 1));
  }
  const vcpus = wholeNumber(fields.get('vcpus'));
  const memoryKiB = wholeNumber(fields.get('memory_kib'));
  const onlineMemoryKiB = wholeNumber(fields.get('online_memory_kib'));
  if (vcpus === undefined || memoryKiB === undefined || onlineMemoryKiB === undefined) return undefined;
  const report: GuestReport = { kind: keyword === 'KATA_TS_READY' ? 'ready' : 'update', vcpus, memoryKiB, onlineMemoryKiB };
  const kernel = fields.get('kernel');
  if (kernel !== undefined) report.kernelRelease = kernel;
  return report;
}

function wholeNumber(text: string | undefined): number | undefined {
  if (text === undefined || !/^\d+$/.test(text)) return undefined;
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : undefined;
}
