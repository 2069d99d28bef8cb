import { MiB, roundUpPow2 } from './pci.js';
import type { BarNeeds, PortCapacity } from './topology-types.js';
import type { PciBar } from './types.js';

/** A bridge I/O window is at least 4 KiB (I/O base/limit have 4 KiB granularity). */
export const IO_WINDOW_BYTES = 4096;
/** Bridge memory windows have 1 MiB granularity. */
export const MEM_WINDOW_GRANULE_BYTES = MiB;

export const NO_NEEDS: BarNeeds = Object.freeze({ ioBytes: 0, mem32Bytes: 0, pref64Bytes: 0, mem32LargestBytes: 0, pref64LargestBytes: 0 });

/** Sum a function's BARs by the bridge window they must land in. */
export function barNeeds(bars: readonly PciBar[], romBytes = 0): BarNeeds {
  const n = { ...NO_NEEDS, mem32Bytes: romBytes, mem32LargestBytes: romBytes };
  for (const b of bars) {
    if (b.kind === 'io') n.ioBytes += b.barBytes;
    else if (b.prefetchable && b.is64bit) {
      n.pref64Bytes += b.barBytes;
      n.pref64LargestBytes = Math.max(n.pref64LargestBytes, b.barBytes);
    } else {
      // Non-prefetchable BARs go to the (32-bit only) non-prefetchable window even when 64-bit;
      // 32-bit prefetchable BARs may sit there too, which saves a second 32-bit window.
      n.mem32Bytes += b.barBytes;
      n.mem32LargestBytes = Math.max(n.mem32LargestBytes, b.barBytes);
    }
  }
  return n;
}

/**
 * The window that surely holds BARs totalling `bytes`, the largest `largest`: BAR sizes are
 * powers of two, so the total rounded up to a power of two packs without gaps when the window
 * is naturally aligned. Firmware does not align it so: SeaBIOS was measured placing a 256 GiB
 * window at 4 GiB. A window of at least twice the largest BAR always contains an aligned slot
 * for it (with room around it for the rest), which is what lets a 32 GiB or 128 GiB GPU BAR in.
 */
export function windowBytes(bytes: number, largest: number, floorBytes: number): number {
  if (bytes <= 0) return floorBytes;
  const aligned = largest > MEM_WINDOW_GRANULE_BYTES ? 2 * largest : 0;
  return Math.max(roundUpPow2(bytes), aligned, MEM_WINDOW_GRANULE_BYTES, floorBytes);
}

export interface WindowFloors {
  memFloorBytes: number;
  pref64FloorBytes: number;
}

/** The capacity a hot-plug port reserves for these needs (a spare port: NO_NEEDS -> the floors). */
export function capacityFor(needs: BarNeeds, floors: WindowFloors): PortCapacity {
  return {
    ioBytes: needs.ioBytes > 0 ? IO_WINDOW_BYTES : 0,
    memBytes: windowBytes(needs.mem32Bytes, needs.mem32LargestBytes, floors.memFloorBytes),
    pref64Bytes: windowBytes(needs.pref64Bytes, needs.pref64LargestBytes, floors.pref64FloorBytes),
  };
}

/**
 * Does a device fit behind a port? Its non-prefetchable and prefetchable BARs each fit their
 * window, or (as Linux falls back to) everything fits the non-prefetchable window. I/O is not
 * required: without an I/O window the kernel leaves I/O BARs unassigned and PCIe drivers use MMIO.
 */
export function fitsCapacity(needs: BarNeeds, cap: PortCapacity): boolean {
  const mem = windowBytes(needs.mem32Bytes, needs.mem32LargestBytes, 0);
  const pref = windowBytes(needs.pref64Bytes, needs.pref64LargestBytes, 0);
  if (mem <= cap.memBytes && pref <= cap.pref64Bytes) return true;
  const together = windowBytes(needs.mem32Bytes + needs.pref64Bytes, Math.max(needs.mem32LargestBytes, needs.pref64LargestBytes), 0);
  return together <= cap.memBytes;
}
