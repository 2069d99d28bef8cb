import { exhausted, invalid } from '../common/errors.js';
import { VIRTIO_MEM_BLOCK_MIB, VIRTIO_MEM_QOM_PATH } from './argv.js';
import type { QmpClient, QmpCpuInstanceProperties, QmpHotpluggableCpu } from './qmp/client.js';

const MiB = 1024 * 1024;

/** The QOM id given to a hot-plugged vCPU: stable for its slot, so a retry cannot add it twice. */
export function vcpuDeviceId(props: QmpCpuInstanceProperties): string {
  return `vcpu-s${props['socket-id'] ?? 0}-c${props['core-id'] ?? 0}-t${props['thread-id'] ?? 0}`;
}

/**
 * Plug `count` more vCPUs into the free slots QEMU offers (lowest core first). The guest init
 * onlines them. Refuses with RESOURCE_EXHAUSTED, before plugging anything, when fewer slots are
 * free (the VM's maxVcpus was planned at boot). Returns the new device ids.
 */
export async function plugVcpus(qmp: QmpClient, count: number): Promise<string[]> {
  if (!Number.isSafeInteger(count) || count < 1)
    throw invalid('VCPU_COUNT_INVALID', `vCPU count to plug must be a positive whole number, not ${count}.`);
  const slots = await qmp.queryHotpluggableCpus();
  const free = slots.filter((s) => s['qom-path'] === undefined).sort(bySlot);
  if (free.length < count) {
    throw exhausted(
      'VCPU_HOTPLUG_EXHAUSTED',
      `${count} more vCPUs were asked for but only ${free.length} of ${slots.length} vCPU slots are free.`,
      { details: { requested: count, free: free.length, slots: slots.length } },
    );
  }
  const ids: string[] = [];
  for (const slot of free.slice(0, count)) {
    const id = vcpuDeviceId(slot.props);
    await qmp.deviceAdd({ driver: slot.type, id, ...slot.props });
    ids.push(id);
  }
  return ids;
}

function bySlot(a: QmpHotpluggableCpu, b: QmpHotpluggableCpu): number {
  const key = (s: QmpHotpluggableCpu): number[] => [s.props['socket-id'] ?? 0, s.props['core-id'] ?? 0, s.props['thread-id'] ?? 0];
  const [ka, kb] = [key(a), key(b)];
  for (let i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i]! - kb[i]!;
  return 0;
}

/**
 * Ask the guest, through virtio-mem, to hold `sizeMiB` of hot-plugged memory (grow or shrink;
 * the guest plugs or unplugs in its own time, watch `virtioMemPluggedMiB`). `maxMiB` is the
 * headroom planned at boot (shape.maxMemoryMiB - shape.memoryMiB).
 */
export async function setVirtioMemSize(qmp: QmpClient, sizeMiB: number, maxMiB: number): Promise<void> {
  if (!Number.isSafeInteger(sizeMiB) || sizeMiB < 0 || sizeMiB % VIRTIO_MEM_BLOCK_MIB !== 0) {
    throw invalid('VIRTIO_MEM_SIZE_INVALID', `virtio-mem size ${sizeMiB} MiB must be a whole multiple of ${VIRTIO_MEM_BLOCK_MIB} MiB.`);
  }
  if (sizeMiB > maxMiB) {
    throw exhausted('MEMORY_HOTPLUG_EXHAUSTED', `${sizeMiB} MiB of hot-plugged memory exceeds the ${maxMiB} MiB planned at boot.`, {
      details: { requestedMiB: sizeMiB, maxMiB },
    });
  }
  await qmp.qomSet(VIRTIO_MEM_QOM_PATH, 'requested-size', sizeMiB * MiB);
}

/** Memory the guest has actually plugged through virtio-mem (may lag the requested size). */
export async function virtioMemPluggedMiB(qmp: QmpClient): Promise<number> {
  return (await qmp.qomGet<number>(VIRTIO_MEM_QOM_PATH, 'size')) / MiB;
}
