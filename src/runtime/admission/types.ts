import type {
  CdiDeviceInput,
  ContainerResourceConfigInput,
  DeviceInput,
  KubernetesResourcesInput,
  LinuxContainerResourcesInput,
  MountInput,
  PodResourceConfigInput,
} from '../../sizing/input.js';

/**
 * The parts of a CreateContainerRequest's ContainerConfig that admission reads, as structural
 * types. A decoded request (proto-loader, keepCase, enums as names, int64 as strings, absent
 * messages as null: `ContainerConfig__Output`) fits without a cast; hand-written objects in tests
 * state only what matters, and a missing field counts as its proto3 default.
 */
export interface ContainerConfigInput {
  metadata?: { name?: string; attempt?: number } | null;
  annotations?: Record<string, string>;
  mounts?: MountInput[];
  devices?: DeviceInput[];
  CDI_devices?: CdiDeviceInput[];
  /** KEP-4112 field 1001: the container's requests and limits as Kubernetes quantities. */
  kubernetes_resources?: KubernetesResourcesInput | null;
  linux?: { resources?: LinuxContainerResourcesInput | null } | null;
}

/** What RunPodSandbox announced (`PodSandboxConfig.pod_resources`), as recorded for the sandbox. */
export type AnnouncedPodResources = PodResourceConfigInput;
export type AnnouncedContainer = ContainerResourceConfigInput;

/**
 * One field where the container asked for differs from what was announced.
 *
 * `field` is a stable path (`kubernetes_resources.limits.memory`, `mounts["/data"].readonly`,
 * `devices["/dev/vfio/12"].permissions`, `CDI_devices["nvidia.com/gpu=0"]`, `mounts order`,
 * `type`, `container`). `announced` and `received` are display values: quantities as written,
 * booleans and enum names bare, free text (paths, names, images) JSON-quoted, and the word
 * `absent` when that side has no such entry.
 */
export interface Difference {
  field: string;
  announced: string;
  received: string;
}

/** The answer of `admitAnnounced`. */
export type AdmissionResult = { ok: true; announced: AnnouncedContainer } | { ok: false; differences: Difference[] };

/** The display value for "this side has no such entry". */
export const ABSENT = 'absent';

/** A free-text value for a Difference (quoted so that an empty string or the word "absent" stays visible). */
export function quoted(text: string | undefined | null): string {
  return JSON.stringify(text ?? '');
}

/** `<prefix>["<key>"]`, the path of one keyed entry. */
export function keyed(prefix: string, key: string): string {
  return `${prefix}[${JSON.stringify(key)}]`;
}
