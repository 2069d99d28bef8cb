import type { Difference } from './types.js';

/**
 * Which kind of container a CreateContainer request creates. ContainerConfig has no type field
 * (KEP-4112 put the type only into the announcement), so the request's annotations are read:
 *
 * - `io.kubernetes.container.type`, set by recent kubelets (pkg/kubelet/kuberuntime/labels.go,
 *   beside the `io.kubernetes.container.hash` and `restartCount` annotations) to `init` for every
 *   entry of spec.initContainers, `container` for spec.containers and `ephemeral` for debug
 *   containers. It cannot tell a sidecar (a restartable init container) from a one-shot init
 *   container, so `init` matches either; ephemeral containers are never announced.
 *   (containerd's `io.kubernetes.cri.container-type` is something else: `sandbox` or `container`,
 *   written by containerd itself into the OCI spec, never sent by the kubelet.)
 * - `kata-ts.dev/container-type` (`init`, `sidecar` or `regular`), defined by kata-ts for clients
 *   that want to state the exact type (crictl, tests, admission webhooks); it must match exactly.
 *
 * Each annotation present must agree with the announced type (a `type` difference otherwise);
 * with neither present the announced type is taken, since names are unique in a pod.
 */
export const KUBELET_CONTAINER_TYPE_ANNOTATION = 'io.kubernetes.container.type';
export const KATA_CONTAINER_TYPE_ANNOTATION = 'kata-ts.dev/container-type';

/** `kata-ts.dev/container-type` values and the announced CRI type each one means. */
export const KATA_CONTAINER_TYPES: Readonly<Record<string, string>> = {
  init: 'INIT_CONTAINER',
  sidecar: 'SIDECAR_CONTAINER',
  regular: 'REGULAR_CONTAINER',
};

/** `io.kubernetes.container.type` values and the announced CRI types each one admits. */
const KUBELET_CONTAINER_TYPES: Readonly<Record<string, readonly string[]>> = {
  init: ['INIT_CONTAINER', 'SIDECAR_CONTAINER'],
  container: ['REGULAR_CONTAINER'],
  ephemeral: [],
};

/** The announced type's CRI name (a number is the proto enum's value). */
export function containerTypeName(type: string | number | undefined | null): string {
  if (type === undefined || type === null || type === 0) return 'INIT_CONTAINER';
  if (typeof type === 'number') return ['INIT_CONTAINER', 'SIDECAR_CONTAINER', 'REGULAR_CONTAINER'][type] ?? String(type);
  return type;
}

/** `type` differences between the announced type and the request's type annotations. */
export function compareContainerType(
  announcedType: string | number | undefined | null,
  annotations: Readonly<Record<string, string>> | undefined,
): Difference[] {
  const announced = containerTypeName(announcedType);
  const out: Difference[] = [];
  const kata = annotations?.[KATA_CONTAINER_TYPE_ANNOTATION];
  if (kata !== undefined && KATA_CONTAINER_TYPES[kata] !== announced) {
    out.push({ field: 'type', announced, received: `${JSON.stringify(kata)} (annotation ${KATA_CONTAINER_TYPE_ANNOTATION})` });
  }
  const kubelet = annotations?.[KUBELET_CONTAINER_TYPE_ANNOTATION];
  if (
    kubelet !== undefined &&
    !(Object.hasOwn(KUBELET_CONTAINER_TYPES, kubelet) && KUBELET_CONTAINER_TYPES[kubelet]!.includes(announced))
  ) {
    out.push({ field: 'type', announced, received: `${JSON.stringify(kubelet)} (annotation ${KUBELET_CONTAINER_TYPE_ANNOTATION})` });
  }
  return out;
}
