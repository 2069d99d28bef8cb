/**
 * QMP steps that give a pre-booted VM what a cold boot puts on its command line (the pool's
 * claim, docs/pool.md): the pod's NIC on its TAP and the virtio-fs device on virtiofsd's socket,
 * each onto a hot-plug port planned at boot. Same ids and properties as the cold argv's devices.
 * Each goes to the port's slot 0 by address: behind a PCIe port the guest scans slot 0 only, so
 * a port already holding a device must refuse the plug rather than take it on a slot the guest
 * never sees (QEMU's first free slot, without `addr`).
 */
import { SHARED_FS_TAG } from './argv.js';
import type { QmpClient } from './qmp/client.js';

/** The only slot behind a PCIe root port the guest scans. */
const PORT_SLOT = '00.0';

/** QOM ids of the claimed devices: the cold argv's own (argv.ts keeps them reserved). */
export const CLAIM_NIC_NETDEV_ID = 'net0';
export const CLAIM_NIC_DEVICE_ID = 'nic0';
export const CLAIM_VFS_CHARDEV_ID = 'virtiofs';
export const CLAIM_VFS_DEVICE_ID = 'vfs0';

export interface ClaimNic {
  tapName: string;
  mac: string;
  vhost: boolean;
  /** The hot-plug port's QOM id. */
  bus: string;
}

/** netdev_add (QEMU opens the TAP by name in its own network namespace), then device_add. */
export async function plugNic(qmp: QmpClient, nic: ClaimNic): Promise<void> {
  await qmp.execute('netdev_add', {
    type: 'tap',
    id: CLAIM_NIC_NETDEV_ID,
    ifname: nic.tapName,
    script: 'no',
    downscript: 'no',
    vhost: nic.vhost,
  });
  try {
    await qmp.deviceAdd({
      driver: 'virtio-net-pci',
      id: CLAIM_NIC_DEVICE_ID,
      netdev: CLAIM_NIC_NETDEV_ID,
      mac: nic.mac,
      bus: nic.bus,
      addr: PORT_SLOT,
    });
  } catch (err) {
    await qmp.execute('netdev_del', { id: CLAIM_NIC_NETDEV_ID }).catch(() => undefined);
    throw err;
  }
}

/**
 * chardev-add (a client socket to virtiofsd's, as QEMU sees the path: inside its jail when
 * confined), then the vhost-user-fs device with the share's tag.
 */
export async function plugSharedFs(qmp: QmpClient, socketPath: string, bus: string): Promise<void> {
  await qmp.execute('chardev-add', {
    id: CLAIM_VFS_CHARDEV_ID,
    backend: { type: 'socket', data: { addr: { type: 'unix', data: { path: socketPath } }, server: false } },
  });
  try {
    await qmp.deviceAdd({
      driver: 'vhost-user-fs-pci',
      id: CLAIM_VFS_DEVICE_ID,
      chardev: CLAIM_VFS_CHARDEV_ID,
      tag: SHARED_FS_TAG,
      bus,
      addr: PORT_SLOT,
    });
  } catch (err) {
    await qmp.execute('chardev-remove', { id: CLAIM_VFS_CHARDEV_ID }).catch(() => undefined);
    throw err;
  }
}
