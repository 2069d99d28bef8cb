/**
 * VM templates (issue 35, docs/templates.md): pure planners for the template VM's argv, a clone's
 * argv, the template's key and the check of a saved template against the key wanted now.
 *
 * A template VM is an ordinary pooled-shape VM (no virtio-fs, no NIC) whose boot RAM lives in a
 * file on a memory file system mapped `share=on`; once its agent answers it is stopped and its
 * device state (not its RAM: `x-ignore-shared`) is migrated to a file. A clone has the same argv
 * except that it maps the same RAM file `share=off` (private: its writes copy the page) and waits
 * for its state (`-incoming defer`).
 */
import { createHash } from 'node:crypto';
import { invalid, precondition } from '../common/errors.js';
import { buildQemuArgv, type QemuArgvSpec, SHARED_FS_TAG, type VmSocketPaths } from './argv.js';

export type TemplateReason =
  | 'TEMPLATE_ARGV_UNSUPPORTED'
  | 'TEMPLATE_CONFIDENTIAL'
  | 'TEMPLATE_DIR_UNUSABLE'
  | 'TEMPLATE_KEY_MISMATCH'
  | 'TEMPLATE_RECORD_INVALID'
  | 'TEMPLATE_STATE_CORRUPT'
  | 'TEMPLATE_RAM_FILE_INVALID'
  | 'TEMPLATE_RAM_NOT_ON_TMPFS'
  | 'TEMPLATE_MIGRATION_FAILED'
  | 'TEMPLATE_CLONE_VHOST_USER';

declare module '../common/errors.js' {
  interface KataReasons {
    hypervisorTemplate: TemplateReason;
  }
}

/**
 * The record's format; a record of another version is refused (rebuild). 2: the guest's last
 * report (`guest`).
 */
export const TEMPLATE_RECORD_VERSION = 2;
/** The boot RAM backend's id in buildQemuArgv's argv (the one whose file clones share). */
const BOOT_RAM_BACKEND_ID = 'ram0';
/** Per-VM paths in the argv are replaced by these when the argv is hashed for the key. */
const CANONICAL_PATHS: VmSocketPaths = {
  qmpSocket: '/template/qmp.sock',
  readySocket: '/template/ready.sock',
  consoleLog: '/template/console.log',
  agentSocket: '/template/agent.sock',
};

/** What a template VM is made of, apart from the per-VM paths and name. */
export type TemplateVmSpec = Omit<QemuArgvSpec, 'paths' | 'name' | 'nic'> & {
  /** The guest agent's channel is what tells that the template is ready: required. */
  withAgent: true;
  /**
   * Root ports outside the topology's slots that a clone's NIC and shared directory are
   * hot-plugged onto (the pool's ports, src/runtime/pool/plan.ts poolPortArgs: a clone takes the
   * pool claim's steps), appended to buildQemuArgv's argv as given. Part of the key.
   */
  hotplugPortArgs?: string[];
};

/**
 * What a template was built from. A clone is started only from a template whose key equals the
 * key computed now from the same inputs: the device state is only valid for the same QEMU, the
 * same argv (devices, their ids and order) and the same guest (kernel, initrd, and the image that
 * holds the agent).
 */
export interface TemplateKey {
  qemuBinarySha256: string;
  kernelSha256: string;
  initrdSha256: string;
  /** The guest image (node, crun, the agent); null when the initramfs is the whole guest. */
  guestImageSha256: string | null;
  /** sha256 of the template argv with canonical per-VM paths (templateArgvDigest). */
  argvSha256: string;
}

/** template.json, written beside the RAM and state files once both are complete. */
export interface TemplateRecord {
  version: number;
  key: TemplateKey;
  /** sha256 of the device state file, checked before its bytes are fed to a clone. */
  stateSha256: string;
  stateBytes: number;
  /** The RAM file's size (the shape's boot RAM). */
  ramBytes: number;
  /**
   * The guest's last size report before the save (its vCPUs and memory, as guest/init sends it on
   * the ready port). A clone's guest is that guest: it sends a report only when its size changes,
   * so a clone that is not grown learns its size from here.
   */
  guest: TemplateGuestReport;
  builtAt: string;
  buildMs: number;
}

export interface TemplateGuestReport {
  vcpus: number;
  memoryKiB: number;
  onlineMemoryKiB: number;
}

/** The files of one template directory. */
export interface TemplatePaths {
  dir: string;
  ramFile: string;
  stateFile: string;
  recordFile: string;
}

/** The files of a template kept in `dir` (a directory on a memory file system). */
export function templatePaths(dir: string): TemplatePaths {
  return { dir, ramFile: `${dir}/ram`, stateFile: `${dir}/state`, recordFile: `${dir}/template.json` };
}

/**
 * Pure: refuse what a template cannot hold. Confidential VMs never clone (their memory and
 * secrets are measured per VM); virtio-fs and NICs are the pod's and are added to a clone later.
 */
export function validateTemplateSpec(spec: TemplateVmSpec): void {
  if (spec.confidential || (spec.tee !== undefined && spec.tee.kind !== 'none')) {
    throw precondition(
      'TEMPLATE_CONFIDENTIAL',
      'spec.confidential: a confidential VM is never templated (each must be measured and attested on its own).',
    );
  }
  if (spec.withAgent !== true) {
    throw invalid('TEMPLATE_ARGV_UNSUPPORTED', 'spec.withAgent must be true: the agent answering is what makes a template ready.');
  }
  // QEMU 7.2 discards a RAM range of a file-backed block by punching a hole in the FILE
  // (ram_block_discard_range: fallocate whenever the block has an fd, private mapping or not).
  // For a clone that file is the template's, mapped by every sibling: a balloon's discards (free
  // page reporting, or an inflate, which the guest drives) would zero pages of other pods' memory.
  // Seen: a clone with free page reporting crashed (guest-reset) and later clones hung.
  if (spec.freePageReporting === true) {
    throw invalid(
      'TEMPLATE_ARGV_UNSUPPORTED',
      "spec.freePageReporting must be off: QEMU 7.2 would punch the reported pages out of the template's RAM file, which every clone maps.",
    );
  }
}

/**
 * Pure: the template VM's argv: buildQemuArgv's, with the boot RAM moved from an anonymous memfd
 * to `ramFile`, mapped shared (the guest's writes land in the file, which clones then map).
 */
export function planTemplateArgv(spec: TemplateVmSpec, name: string, paths: VmSocketPaths, ramFile: string): string[] {
  validateTemplateSpec(spec);
  return withFileRam(baseArgv(spec, name, paths), ramFile, true);
}

/** buildQemuArgv's argv of the spec (no virtio-fs socket), then its hot-plug ports. */
function baseArgv(spec: TemplateVmSpec, name: string, paths: VmSocketPaths): string[] {
  const { withAgent: _agent, hotplugPortArgs = [], ...argvSpec } = spec;
  return [...buildQemuArgv({ ...argvSpec, name, paths: { ...paths, virtiofsSocket: undefined } }), ...hotplugPortArgs];
}

/**
 * Pure: a clone's argv: the template's with the RAM file mapped private (copy on write) and
 * `-incoming defer` (QEMU waits for `migrate-incoming`). Same devices, ids and order as the
 * template, which the device state requires.
 */
export function planCloneArgv(spec: TemplateVmSpec, name: string, paths: VmSocketPaths, ramFile: string, share?: CloneShare): string[] {
  validateTemplateSpec(spec);
  const base = baseArgv(spec, name, paths);
  const fsdev = share === undefined ? [] : ['-fsdev', cloneFsdevArg(share)];
  return [...withFileRam(base, ramFile, false), ...fsdev, '-incoming', 'defer'];
}

/**
 * A clone's shared directory over virtio-9p (docs/templates.md: virtio-fs cannot serve a clone).
 * QEMU 7.2 has no QMP command that adds an fsdev, so the backend is on the clone's command line
 * from its start (a backend is not part of the migrated state) and the device is hot-plugged at
 * claim (planClone9pDevice).
 */
export interface CloneShare {
  /** The pod's shared directory on the host (QEMU's view of it when confined). */
  hostDir: string;
  /**
   * `mapped-xattr` for a QEMU without CAP_CHOWN (a confined one): ownership and modes the guest
   * sets are kept in xattrs; `none` maps nothing (files are QEMU's).
   */
  securityModel: 'mapped-xattr' | 'none';
}

/** The id of a clone's 9p backend and device. */
export const CLONE_9P_FSDEV_ID = 'shared9p';
export const CLONE_9P_DEVICE_ID = 'p9shared';
/** The 9p mount tag: the same tag the virtio-fs share has, so the guest finds its share by one name. */
export const CLONE_9P_TAG = SHARED_FS_TAG;

function cloneFsdevArg(share: CloneShare): string {
  if (share.hostDir.includes(',') || !share.hostDir.startsWith('/')) {
    throw invalid('TEMPLATE_ARGV_UNSUPPORTED', `share.hostDir ${share.hostDir} must be absolute and hold no comma.`);
  }
  return `local,id=${CLONE_9P_FSDEV_ID},path=${share.hostDir},security_model=${share.securityModel}`;
}

/** Pure: QMP device_add arguments of a clone's 9p share, at slot 0 of `bus` (a PCIe port), as the pool plugs virtio-fs. */
export function planClone9pDevice(bus: string): {
  driver: string;
  id: string;
  fsdev: string;
  mount_tag: string;
  bus: string;
  addr: string;
} {
  checkCloneHotplug('virtio-9p-pci');
  return { driver: 'virtio-9p-pci', id: CLONE_9P_DEVICE_ID, fsdev: CLONE_9P_FSDEV_ID, mount_tag: CLONE_9P_TAG, bus, addr: '0' };
}

/** Pure: sha256 of the template argv with canonical paths and name: the argv part of the key. */
export function templateArgvDigest(spec: TemplateVmSpec): string {
  const argv = planTemplateArgv(spec, 'kata-ts-template', CANONICAL_PATHS, '/template/ram');
  return createHash('sha256').update(JSON.stringify(argv)).digest('hex');
}

/** The QMP commands of a template's save and a clone's restore, in order (for logs and tests). */
export interface MigrationStep {
  command: string;
  arguments?: Record<string, unknown>;
}

/** Pure: the template's save: RAM stays in the shared file, only device state is streamed. */
export function planTemplateSave(migrationUri: string): MigrationStep[] {
  return [
    { command: 'migrate-set-capabilities', arguments: { capabilities: [{ capability: 'x-ignore-shared', state: true }] } },
    { command: 'stop' },
    { command: 'migrate', arguments: { uri: migrationUri } },
  ];
}

/** Pure: a clone's restore; `cont` follows once query-migrate says completed. */
export function planCloneRestore(migrationUri: string): MigrationStep[] {
  return [
    { command: 'migrate-set-capabilities', arguments: { capabilities: [{ capability: 'x-ignore-shared', state: true }] } },
    { command: 'migrate-incoming', arguments: { uri: migrationUri } },
  ];
}

/**
 * Pure: refuse a hot-plug into a clone that vhost-user would break. vhost-user hands the backend
 * (virtiofsd) an fd of each RAM region; for a clone that fd is the template's file, which the
 * clone maps private: the backend would read and write the template's pages, not the clone's.
 */
export function checkCloneHotplug(driver: string): void {
  if (driver.startsWith('vhost-user')) {
    throw precondition(
      'TEMPLATE_CLONE_VHOST_USER',
      `device driver ${driver} cannot be added to a clone: its backend would map the template's RAM file, not the clone's private copy (docs/templates.md).`,
    );
  }
}

/**
 * Pure: check a saved record against the key wanted now. Returns the record; throws
 * TEMPLATE_KEY_MISMATCH naming every field that differs, TEMPLATE_RECORD_INVALID for a record of
 * another version or shape.
 */
export function verifyTemplateRecord(record: unknown, wanted: TemplateKey): TemplateRecord {
  if (!isRecord(record))
    throw precondition('TEMPLATE_RECORD_INVALID', 'template.json is not a template record of this version; rebuild it.');
  const differing = (Object.keys(wanted) as Array<keyof TemplateKey>).filter((k) => record.key[k] !== wanted[k]);
  if (differing.length > 0) {
    throw precondition('TEMPLATE_KEY_MISMATCH', `the template was built from another ${differing.join(', ')}; rebuild it before cloning.`, {
      details: { differing },
    });
  }
  return record;
}

function isRecord(value: unknown): value is TemplateRecord {
  if (typeof value !== 'object' || value === null) return false;
  const r = value as Partial<TemplateRecord>;
  const hex = (v: unknown): boolean => typeof v === 'string' && /^[0-9a-f]{64}$/.test(v);
  const key = r.key as Partial<TemplateKey> | undefined;
  return (
    r.version === TEMPLATE_RECORD_VERSION &&
    typeof key === 'object' &&
    key !== null &&
    hex(key.qemuBinarySha256) &&
    hex(key.kernelSha256) &&
    hex(key.initrdSha256) &&
    (key.guestImageSha256 === null || hex(key.guestImageSha256)) &&
    hex(key.argvSha256) &&
    hex(r.stateSha256) &&
    Number.isSafeInteger(r.stateBytes) &&
    (r.stateBytes ?? 0) > 0 &&
    Number.isSafeInteger(r.ramBytes) &&
    (r.ramBytes ?? 0) > 0 &&
    isGuestReport(r.guest)
  );
}

function isGuestReport(value: unknown): value is TemplateGuestReport {
  if (typeof value !== 'object' || value === null) return false;
  const g = value as Partial<TemplateGuestReport>;
  const count = (v: unknown): boolean => Number.isSafeInteger(v) && (v as number) > 0;
  return count(g.vcpus) && count(g.memoryKiB) && count(g.onlineMemoryKiB);
}

/** Replace the boot RAM's memfd backend by a file backend; refuse an argv the template cannot hold. */
function withFileRam(argv: string[], ramFile: string, share: boolean): string[] {
  if (ramFile.includes(','))
    throw invalid('TEMPLATE_RAM_FILE_INVALID', `ramFile ${ramFile} holds a comma, which QEMU's option syntax cannot carry.`);
  const out = [...argv];
  let replaced = 0;
  for (let i = 0; i < out.length; i++) {
    const value = out[i]!;
    if (/vhost-user|^tap,|confidential-guest-support/.test(value) || value === '-netdev' || value === '-tpmdev') {
      throw invalid('TEMPLATE_ARGV_UNSUPPORTED', `argv[${i}] "${value}" has no place in a template (no virtio-fs, NIC or TEE).`);
    }
    if (out[i - 1] === '-object' && value.startsWith(`memory-backend-memfd,id=${BOOT_RAM_BACKEND_ID},`)) {
      const size = /,size=([0-9]+M),/.exec(value)?.[1];
      if (size === undefined) throw invalid('TEMPLATE_ARGV_UNSUPPORTED', `argv[${i}] "${value}" names no size in MiB.`);
      out[i] = `memory-backend-file,id=${BOOT_RAM_BACKEND_ID},size=${size},mem-path=${ramFile},share=${share ? 'on' : 'off'}`;
      replaced += 1;
    }
  }
  if (replaced !== 1)
    throw invalid('TEMPLATE_ARGV_UNSUPPORTED', `the argv has ${replaced} boot RAM backends (${BOOT_RAM_BACKEND_ID}); one was expected.`);
  return out;
}
