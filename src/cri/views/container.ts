import type { Container } from '../../generated/runtime/v1/Container.js';
import type { ContainerStatus } from '../../generated/runtime/v1/ContainerStatus.js';
import type { ContainerUser } from '../../generated/runtime/v1/ContainerUser.js';
import type { ContainerRecord } from '../../runtime/container/record.js';

/** ListContainers' view of one container. */
export function containerView(r: ContainerRecord): Container {
  return {
    id: r.id,
    pod_sandbox_id: r.sandboxId,
    metadata: r.metadata,
    image: {
      image: r.image.requested,
      annotations: r.spec.image.annotations,
      user_specified_image: r.spec.image.user_specified_image,
    },
    image_ref: r.image.ref,
    state: r.state,
    created_at: r.createdAtNs,
    labels: r.labels,
    annotations: r.annotations,
    image_id: r.image.id,
  };
}

/**
 * The identity the container's first process runs with, as its OCI spec says (the kubelet checks
 * it against the SupplementalGroupsPolicy it asked for); null for a container created without a
 * guest plan.
 */
export function containerUser(r: ContainerRecord): ContainerUser | null {
  const user = r.guest?.ociSpec.process?.user;
  if (user === undefined) return null;
  return { linux: { uid: user.uid, gid: user.gid, supplemental_groups: user.additionalGids ?? [] } };
}

/** ContainerStatus' view: the list view plus times, exit, mounts, log path, resources and user. */
export function containerStatusView(r: ContainerRecord): ContainerStatus {
  const { spec } = r;
  return {
    ...containerView(r),
    started_at: r.startedAtNs,
    finished_at: r.finishedAtNs,
    exit_code: r.exitCode,
    reason: r.reason,
    message: r.message,
    mounts: spec.mounts,
    log_path: r.logPath,
    resources: spec.linux?.resources ? { linux: spec.linux.resources } : null,
    stop_signal: spec.stop_signal,
    user: containerUser(r),
  };
}
