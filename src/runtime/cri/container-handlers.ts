import { unimplemented } from '../../common/errors.js';
import type { ContainerStatusRequest__Output } from '../../generated/runtime/v1/ContainerStatusRequest.js';
import type { ContainerStatusResponse } from '../../generated/runtime/v1/ContainerStatusResponse.js';
import type { CreateContainerRequest__Output } from '../../generated/runtime/v1/CreateContainerRequest.js';
import type { CreateContainerResponse } from '../../generated/runtime/v1/CreateContainerResponse.js';
import type { ListContainersRequest__Output } from '../../generated/runtime/v1/ListContainersRequest.js';
import type { ListContainersResponse } from '../../generated/runtime/v1/ListContainersResponse.js';
import type { RemoveContainerRequest__Output } from '../../generated/runtime/v1/RemoveContainerRequest.js';
import type { StopContainerRequest__Output } from '../../generated/runtime/v1/StopContainerRequest.js';
import type { UpdateContainerResourcesRequest__Output } from '../../generated/runtime/v1/UpdateContainerResourcesRequest.js';
import type { UpdatePodSandboxResourcesRequest__Output } from '../../generated/runtime/v1/UpdatePodSandboxResourcesRequest.js';
import type { ContainerManager } from '../container/manager.js';
import { containerStatusView, containerView } from '../container/views.js';
import type { ResourceUpdates } from '../resize/index.js';
import type { RuntimeRpcHandlers } from './rpcs.js';
import type { CallContext } from './server.js';

/**
 * Thin CRI handlers over the ContainerManager and ResourceUpdates, each checked against its rpc
 * in the generated RuntimeService (a misspelled name does not compile).
 */
export function containerHandlers(containers: ContainerManager, resize: ResourceUpdates) {
  return {
    CreateContainer: async (req: CreateContainerRequest__Output, ctx: CallContext): Promise<CreateContainerResponse> => ({
      container_id: await containers.create(req, ctx),
    }),
    StartContainer: async () => {
      throw unimplemented(
        'START_CONTAINER_UNIMPLEMENTED',
        'StartContainer is not implemented yet: kata-ts creates containers in the pod VM but cannot start them inside the guest',
      );
    },
    StopContainer: async (req: StopContainerRequest__Output, ctx: CallContext) => {
      await containers.stop(req.container_id, ctx);
      return {};
    },
    RemoveContainer: async (req: RemoveContainerRequest__Output, ctx: CallContext) => {
      await containers.remove(req.container_id, ctx);
      return {};
    },
    ContainerStatus: async (req: ContainerStatusRequest__Output, ctx: CallContext): Promise<ContainerStatusResponse> => {
      const record = containers.resolve(req.container_id);
      ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
      return {
        status: containerStatusView(record),
        info: req.verbose
          ? {
              info: JSON.stringify({
                sandboxId: record.sandboxId,
                rootfs: record.rootfs,
                devices: record.devices,
                demand: record.demand,
                image: record.image,
              }),
            }
          : {},
      };
    },
    ListContainers: async (req: ListContainersRequest__Output): Promise<ListContainersResponse> => ({
      containers: containers.list(req.filter).map(containerView),
    }),
    UpdateContainerResources: async (req: UpdateContainerResourcesRequest__Output, ctx: CallContext) => {
      await resize.updateContainer(req, ctx);
      return {};
    },
    UpdatePodSandboxResources: async (req: UpdatePodSandboxResourcesRequest__Output, ctx: CallContext) => {
      await resize.updatePodSandbox(req, ctx);
      return {};
    },
  } satisfies Partial<RuntimeRpcHandlers>;
}
