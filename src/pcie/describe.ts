import { className, formatBytes, hex4 } from './pci.js';
import { pciAddr } from './qemu-args.js';
import type { PciePort, PcieTopology, PortUse } from './topology-types.js';

export interface PortDescription {
  id: string;
  device: PciePort['driver'];
  /** `pcie.0:08.1` or `swup0:03.0`. */
  address: string;
  use: PortUse;
  /** Host function attached at boot, reserved for hot-plug, or attached later; null for spares. */
  function: string | null;
  state: 'attached-at-boot' | 'reserved' | 'hot-plugged' | 'free' | 'switch';
  /** QEMU properties (`0`, `16 MiB`) or `default` when left to the firmware. */
  reserve: { io: string; mem: string; pref64: string };
  /** What a hot-plugged device may use behind this port. */
  capacity: { io: string; mem: string; pref64: string };
}

export interface FunctionDescription {
  bdf: string;
  /** `10de:2330` */
  id: string;
  class: string;
  group: number;
  numaNode: number | null;
  plug: string;
  port: string;
  bars: { io: string; mem32: string; pref64: string };
}

/** The `pcie` section of `kata-ts plan` output. */
export interface PcieDescription {
  layout: PcieTopology['portType'];
  policy: PcieTopology['policy'];
  confidential: boolean;
  ports: PortDescription[];
  switches: Array<{ id: string; rootPort: string; downstreamPorts: string[] }>;
  functions: FunctionDescription[];
  leftOut: Array<{ bdf: string; group: number; reason: string }>;
  usage: {
    busNumbers: string;
    rootSlots: string;
    ioWindows: number;
    mmio32: string;
    mmio64: string;
  };
  notes: string[];
}

const size = (n: number | null): string => (n === null ? 'default' : n === 0 ? '0' : formatBytes(n));

function stateOf(p: PciePort): PortDescription['state'] {
  if (p.use === 'switch') return 'switch';
  if (p.occupant !== null) return p.occupant.attached === 'boot' ? 'attached-at-boot' : 'hot-plugged';
  return p.reservedFor !== null ? 'reserved' : 'free';
}

/** Pure: a JSON-friendly account of the topology: ports, switches, which function goes where. */
export function describeTopology(t: PcieTopology): PcieDescription {
  return {
    layout: t.portType,
    policy: t.policy,
    confidential: t.confidential,
    ports: t.ports.map((p) => ({
      id: p.id,
      device: p.driver,
      address: `${p.bus}:${pciAddr(p.slot, p.function)}`,
      use: p.use,
      function: p.occupant?.bdf ?? p.occupant?.driver ?? p.reservedFor,
      state: stateOf(p),
      reserve: { io: size(p.reserve.ioBytes), mem: size(p.reserve.memBytes), pref64: size(p.reserve.pref64Bytes) },
      capacity: { io: size(p.capacity.ioBytes), mem: size(p.capacity.memBytes), pref64: size(p.capacity.pref64Bytes) },
    })),
    switches: t.switches.map((s) => ({ id: s.id, rootPort: s.rootPortId, downstreamPorts: [...s.downstreamPortIds] })),
    functions: t.functions.map((f) => ({
      bdf: f.bdf,
      id: `${hex4(f.vendorId)}:${hex4(f.deviceId)}`,
      class: className(f.classCode),
      group: f.group,
      numaNode: f.numaNode,
      plug: f.plug,
      port: f.portId,
      bars: { io: size(f.needs.ioBytes), mem32: size(f.needs.mem32Bytes), pref64: size(f.needs.pref64Bytes) },
    })),
    leftOut: t.groups.flatMap((g) => g.leftOut.map((l) => ({ bdf: l.bdf, group: g.group, reason: l.reason }))),
    usage: {
      busNumbers: `${t.usage.busNumbers}/${t.usage.busNumbersMax}`,
      rootSlots: `${t.usage.rootSlots}/${t.usage.rootSlotsMax}`,
      ioWindows: t.usage.ioWindows,
      mmio32: `${size(t.usage.mmio32Bytes)} of ${size(t.usage.mmio32BudgetBytes)}`,
      mmio64: size(t.usage.mmio64Bytes),
    },
    notes: [...t.notes],
  };
}

/** Pure: the same account as aligned text lines, for `kata-ts plan --format text`. */
export function describeTopologyText(t: PcieTopology): string[] {
  const d = describeTopology(t);
  if (d.ports.length === 0) return ['PCIe: no ports (no VFIO devices, no spare ports)'];
  const reserved = d.ports.filter((p) => p.use === 'hot-plug').length;
  const cold = d.ports.filter((p) => p.use === 'cold-plug').length;
  const spare = d.ports.filter((p) => p.use === 'spare').length;
  const lines = [
    `PCIe: ${d.layout} layout, ${d.policy} policy${d.confidential ? ' (confidential)' : ''}: ${cold} attached at boot, ${reserved} reserved for announced devices, ${spare} spare`,
  ];
  const fnByBdf = new Map(d.functions.map((f) => [f.bdf, f]));
  const rows = d.ports.map((p) => {
    const f = p.function === null ? undefined : fnByBdf.get(p.function);
    const what =
      f === undefined
        ? (p.function ?? '')
        : `${f.bdf} ${f.id} ${f.class} group ${f.group}${f.numaNode === null ? '' : ` numa ${f.numaNode}`}`;
    return [p.id, p.address, p.state, what, `io ${p.reserve.io}, mem ${p.reserve.mem}, pref64 ${p.reserve.pref64}`];
  });
  const widths = [0, 1, 2, 3].map((i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const r of rows) lines.push(`  ${r.map((c, i) => (i < 4 ? c.padEnd(widths[i]!) : c)).join('  ')}`);
  for (const s of d.switches) lines.push(`  switch ${s.id} behind ${s.rootPort}: ${s.downstreamPorts.join(' ')}`);
  for (const l of d.leftOut) lines.push(`  left on the host: ${l.bdf} (group ${l.group}, ${l.reason})`);
  lines.push(
    `  buses ${d.usage.busNumbers}, root slots ${d.usage.rootSlots}, I/O windows ${d.usage.ioWindows}, 32-bit MMIO ${d.usage.mmio32}, 64-bit MMIO ${d.usage.mmio64}`,
  );
  for (const n of d.notes) lines.push(`  note: ${n}`);
  return lines;
}
