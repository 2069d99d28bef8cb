/**
 * Exec, Attach and PortForward: validate as the kubelet does, check the target exists now
 * (NOT_FOUND naming it), and answer a single-use URL of the streaming server.
 */
import type { AgentClient } from '../agent-client/index.js';
import { precondition } from '../common/errors.js';
import type { AttachRequest__Output } from '../generated/runtime/v1/AttachRequest.js';
import type { AttachResponse } from '../generated/runtime/v1/AttachResponse.js';
import type { ExecRequest__Output } from '../generated/runtime/v1/ExecRequest.js';
import type { ExecResponse } from '../generated/runtime/v1/ExecResponse.js';
import type { PortForwardRequest__Output } from '../generated/runtime/v1/PortForwardRequest.js';
import type { PortForwardResponse } from '../generated/runtime/v1/PortForwardResponse.js';
import type { ContainerManager } from '../runtime/container/manager.js';
import type { SandboxGuestAccess } from '../runtime/container/types.js';
import type { SandboxManager } from '../runtime/sandbox/manager.js';
import type { CallContext } from './server.js';
import { decodeAttachRequest, decodeExecRequest, decodePortForwardRequest } from './streaming/requests.js';
import type { StreamingServer, StreamingTargets } from './streaming/server.js';

/** Where the streaming server finds containers and sandbox agents. */
export function streamingTargets(containers: ContainerManager, sandboxes: SandboxManager, guests: SandboxGuestAccess): StreamingTargets {
  return {
    container: (id) => {
      const record = containers.resolve(id);
      const agent = guests.agentOf(record.sandboxId);
      if (record.state !== 'CONTAINER_RUNNING' || agent === undefined) {
        throw precondition('CONTAINER_NOT_RUNNING', `container ${record.id} is not running; streams need a running container`);
      }
      return { agent, record };
    },
    sandboxAgent: (id): AgentClient => {
      const live = sandboxes.resolve(id);
      if (live.vm === undefined || live.agent === undefined) {
        throw precondition('SANDBOX_NOT_READY', `pod sandbox ${live.record.id} is not ready; port-forward needs its VM`);
      }
      return live.agent;
    },
  };
}

export function streamingHandlers(server: StreamingServer, targets: StreamingTargets) {
  return {
    Exec: async (req: ExecRequest__Output, ctx: CallContext): Promise<ExecResponse> => {
      const request = decodeExecRequest(req);
      if (request.kind !== 'exec') return { url: '' };
      const { record } = targets.container(request.containerId);
      ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId, tty: request.tty, stdin: request.stdin });
      return { url: server.urlFor({ ...request, containerId: record.id }) };
    },
    Attach: async (req: AttachRequest__Output, ctx: CallContext): Promise<AttachResponse> => {
      const request = decodeAttachRequest(req);
      if (request.kind !== 'attach') return { url: '' };
      const { record } = targets.container(request.containerId);
      ctx.annotate({ containerId: record.id, sandboxId: record.sandboxId });
      return { url: server.urlFor({ ...request, containerId: record.id }) };
    },
    PortForward: async (req: PortForwardRequest__Output, ctx: CallContext): Promise<PortForwardResponse> => {
      const request = decodePortForwardRequest(req);
      if (request.kind !== 'portforward') return { url: '' };
      targets.sandboxAgent(request.sandboxId);
      ctx.annotate({ sandboxId: request.sandboxId });
      return { url: server.urlFor(request) };
    },
  };
}
