/**
 * What containerd (1.6-2.x) and CRI-O hand a shim -> the core's typed specs, each decoded and
 * validated once (pure): the sandbox's config.json (`decodePodSpec`), an app container's
 * (`decodeTaskContainerSpec`), an exec's process (`decodeExecProcess`), and which of the two a
 * bundle is (`decodeBundleRole`). See README.md for where each value comes from.
 */
import { type BundleRole, bundleRoleOf } from './annotations.js';
import { parseOciRuntimeSpec } from './spec.js';

export type { BundleRole, ManagerKind } from './annotations.js';
export { CONTAINERD_ANNOTATIONS, CRIO_ANNOTATIONS } from './annotations.js';
export { decodeLinuxResources, decodeTaskContainerSpec, isSandboxFile, type TaskContainerDecodeOptions } from './container.js';
export { decodeExecProcess, type ExecSpec } from './exec.js';
export { type CgroupPlacement, cgroupPlacementOf, type DecodedPod, decodePodSpec, type PodDecodeOptions, parseResolvConf } from './pod.js';
export type { ShimDecodeReason } from './reasons.js';
export {
  decodeSoloTask,
  isSoloBundle,
  podNameFor,
  podNamespaceFor,
  type SoloDecodeOptions,
  type SoloTask,
  soloPodResources,
} from './solo.js';
export { type OciRuntimeProcess, type OciRuntimeSpec, parseOciProcess, parseOciRuntimeSpec } from './spec.js';

/** A bundle's config.json (untrusted JSON): the pod's sandbox or an app container, of which pod, written by whom. */
export function decodeBundleRole(oci: unknown): BundleRole {
  return bundleRoleOf(parseOciRuntimeSpec(oci).annotations ?? {});
}
