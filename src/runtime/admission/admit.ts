import { compareContainerType } from './container-type.js';
import { compareCdiDevices, compareDevices } from './devices.js';
import { compareMounts } from './mounts.js';
import { compareKubernetesResources } from './resources.js';
import { type AdmissionResult, type AnnouncedPodResources, type ContainerConfigInput, type Difference, quoted } from './types.js';

/**
 * KEP-4112 admission (pure): the VM was shaped for exactly the containers RunPodSandbox announced
 * in `pod_resources`, so a CreateContainer request must match one of them. The container is
 * matched by name (`metadata.name`, unique in a pod), then compared field by field:
 * type (see container-type.ts), `kubernetes_resources` by value, mounts, devices and CDI devices.
 *
 * Returns the announced entry when everything matches, else EVERY difference (never just the
 * first), in a stable order: type, requests, limits, mounts (by path, then order), devices, CDI
 * devices. An unknown name yields the single `container` difference, whose announced value lists
 * the announced names. Never throws: malformed values become differences that say so.
 */
export function admitAnnounced(announced: AnnouncedPodResources, received: ContainerConfigInput): AdmissionResult {
  const name = received.metadata?.name ?? '';
  const containers = announced.containers ?? [];
  const match = containers.find((c) => (c.name ?? '') === name);
  if (match === undefined) {
    const names = containers.map((c) => quoted(c.name)).join(', ');
    return { ok: false, differences: [{ field: 'container', announced: names === '' ? 'no containers' : names, received: quoted(name) }] };
  }
  const differences: Difference[] = [
    ...compareContainerType(match.type, received.annotations),
    ...compareKubernetesResources(match.kubernetes_resources, received.kubernetes_resources),
    ...compareMounts(match.mounts, received.mounts),
    ...compareDevices(match.devices, received.devices),
    ...compareCdiDevices(match.CDI_devices, received.CDI_devices),
  ];
  return differences.length === 0 ? { ok: true, announced: match } : { ok: false, differences };
}
