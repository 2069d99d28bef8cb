import { invalid } from '../common/errors.js';
import type { MountInput } from '../sizing/input.js';
import type { ContainerManifest, PodManifest, VolumeManifest } from './pod.js';

/**
 * CRI mounts for a container's volumeMounts, with the host paths a kubelet would use:
 * <root>/pods/<uid>/volumes/<plugin>/<volume> (the plugin's name with '/' escaped as '~'),
 * the node path itself for hostPath, <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<n>
 * for a subPath mount, and an image reference (no host path) for an image volume (KEP-4639).
 * The kubelet's own extra mounts (/etc/hosts, the termination log) are not listed: they carry
 * paths the kubelet picks at container creation.
 */

/** Volume source -> in-tree plugin name, as it appears in the kubelet's volume directories. */
const PLUGIN_DIRS: Record<string, string> = {
  emptyDir: 'kubernetes.io~empty-dir',
  configMap: 'kubernetes.io~configmap',
  secret: 'kubernetes.io~secret',
  projected: 'kubernetes.io~projected',
  downwardAPI: 'kubernetes.io~downward-api',
  nfs: 'kubernetes.io~nfs',
  iscsi: 'kubernetes.io~iscsi',
  fc: 'kubernetes.io~fc',
  local: 'kubernetes.io~local-volume',
};

/** CSI-backed sources mount under kubernetes.io~csi/<name>/mount. */
const CSI_SOURCES = new Set(['csi', 'ephemeral', 'persistentVolumeClaim']);

const PROPAGATION = {
  None: 'PROPAGATION_PRIVATE',
  HostToContainer: 'PROPAGATION_HOST_TO_CONTAINER',
  Bidirectional: 'PROPAGATION_BIDIRECTIONAL',
} as const;

function volumeHostPath(volume: VolumeManifest, podDir: string, at: string): string {
  if (volume.kind === 'hostPath') {
    const path = volume.source.path;
    if (typeof path !== 'string' || !path.startsWith('/')) {
      throw invalid('MANIFEST_INVALID', `${at}.hostPath.path must be an absolute path`, { details: { path: at } });
    }
    return path;
  }
  if (CSI_SOURCES.has(volume.kind)) {
    // A PVC's directory is named after its bound PV, unknown here: the claim name stands in.
    const claim = volume.source.claimName;
    const name = volume.kind === 'persistentVolumeClaim' && typeof claim === 'string' ? claim : volume.name;
    return `${podDir}/volumes/kubernetes.io~csi/${name}/mount`;
  }
  const plugin = PLUGIN_DIRS[volume.kind] ?? `kubernetes.io~${volume.kind.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
  return `${podDir}/volumes/${plugin}/${volume.name}`;
}

export function containerMounts(pod: PodManifest, uid: string, container: ContainerManifest, kubeletRoot: string): MountInput[] {
  const podDir = `${kubeletRoot}/pods/${uid}`;
  const volumes = new Map(pod.volumes.map((v, i) => [v.name, { v, at: `spec.volumes[${i}]` }]));
  return container.volumeMounts.map((m, index): MountInput => {
    const { v, at } = volumes.get(m.name)!; // readPodManifest checked every reference
    const base = {
      container_path: m.mountPath,
      readonly: m.readOnly,
      selinux_relabel: false,
      propagation: PROPAGATION[m.mountPropagation],
      recursive_read_only: m.readOnly && m.recursiveReadOnly === 'Enabled',
    };
    if (v.kind === 'image') {
      const reference = v.source.reference;
      if (typeof reference !== 'string' || reference === '') {
        throw invalid('MANIFEST_INVALID', `${at}.image.reference must name an image`, { details: { path: at } });
      }
      return { ...base, host_path: '', readonly: true, image: { image: reference }, image_sub_path: m.subPath };
    }
    const hostPath = m.subPath === '' ? volumeHostPath(v, podDir, at) : `${podDir}/volume-subpaths/${m.name}/${container.name}/${index}`;
    return { ...base, host_path: hostPath, image: null, image_sub_path: '' };
  });
}
