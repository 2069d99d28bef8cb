import { qemuSize } from './pci.js';
import type { PciePort, PcieTopology } from './topology-types.js';

/** `08.1`: slot and function in hex, the spelling lspci uses and QEMU's addr property parses. */
export function pciAddr(slot: number, fn: number): string {
  return `${slot.toString(16).padStart(2, '0')}.${fn}`;
}

function portArg(p: PciePort): string {
  const props = [p.driver, `id=${p.id}`, `bus=${p.bus}`, `addr=${pciAddr(p.slot, p.function)}`];
  if (p.multifunction) props.push('multifunction=on');
  props.push(`chassis=${p.chassis}`, `slot=${p.physicalSlot}`, `port=${p.portNumber}`);
  // io-reserve=0 is what lifts Kata's 16-port ceiling: every port otherwise claims a 4 KiB slice
  // of the 64 KiB I/O space, which runs out after about 16 ports.
  if (p.reserve.ioBytes !== null) props.push(`io-reserve=${qemuSize(p.reserve.ioBytes)}`);
  if (p.reserve.memBytes !== null) props.push(`mem-reserve=${qemuSize(p.reserve.memBytes)}`);
  if (p.reserve.pref64Bytes !== null) props.push(`pref64-reserve=${qemuSize(p.reserve.pref64Bytes)}`);
  return props.join(',');
}

/** The vfio-pci argument of a function attached at boot (or its emulated stand-in, see PcieArgsOptions). */
export function coldPlugArg(bdf: string, port: PciePort, qemuId: string, options: PcieArgsOptions = {}): string {
  if (options.simulateVfioWith) return [options.simulateVfioWith, `bus=${port.id}`, `id=${qemuId}`].join(',');
  return ['vfio-pci', `host=${bdf}`, `bus=${port.id}`, `id=${qemuId}`].join(',');
}

export interface PcieArgsOptions {
  /** Hosts without VFIO hardware: this emulated model stands where each vfio-pci function would. */
  simulateVfioWith?: string | null;
}

/**
 * The `-device` pairs of a topology, in an order QEMU accepts (every bus exists before a device
 * names it): root ports by address, switch upstreams, downstream ports, then the vfio-pci
 * devices attached at boot. Deterministic: the same topology gives byte-identical arguments.
 */
export function pcieQemuArgs(t: PcieTopology, options: PcieArgsOptions = {}): string[] {
  const args: string[] = [];
  const device = (arg: string): void => {
    args.push('-device', arg);
  };
  const byId = new Map(t.ports.map((p) => [p.id, p]));
  for (const p of t.ports) if (p.driver === 'pcie-root-port') device(portArg(p));
  for (const sw of t.switches) device(`x3130-upstream,id=${sw.id},bus=${sw.rootPortId},addr=00.0`);
  for (const sw of t.switches) {
    for (const id of sw.downstreamPortIds) device(portArg(byId.get(id)!));
  }
  for (const p of t.ports) {
    if (p.occupant?.attached === 'boot' && p.occupant.bdf !== null) device(coldPlugArg(p.occupant.bdf, p, p.occupant.qemuId, options));
  }
  return args;
}

/**
 * The same arguments without the vfio-pci devices: what can start on a machine without VFIO
 * hardware (integration tests, `doctor`), with every port and switch still in place.
 */
export function pcieQemuArgsWithoutVfio(t: PcieTopology): string[] {
  const args = pcieQemuArgs(t);
  const out: string[] = [];
  for (let i = 0; i < args.length; i += 2) {
    if (!args[i + 1]!.startsWith('vfio-pci,')) out.push(args[i]!, args[i + 1]!);
  }
  return out;
}
