import { packageVersion } from '../common/paths.js';
import type { KataConfig } from '../config/types.js';
import type { RuntimeConfigResponse } from '../generated/runtime/v1/RuntimeConfigResponse.js';
import type { StatusRequest__Output } from '../generated/runtime/v1/StatusRequest.js';
import type { StatusResponse } from '../generated/runtime/v1/StatusResponse.js';
import type { UpdateRuntimeConfigRequest__Output } from '../generated/runtime/v1/UpdateRuntimeConfigRequest.js';
import type { VersionResponse } from '../generated/runtime/v1/VersionResponse.js';
import type { RuntimeFacts } from '../runtime/facts.js';
import type { CallContext } from './server.js';

/**
 * Whether pods can get a network, as the daemon found out (src/network's networkReadiness): the
 * face only reports it, so it names the shape rather than importing the network driver.
 */
export interface NetworkReadiness {
  ready: boolean;
  reason: string;
  message: string;
}

/** The CRI API version this runtime speaks. */
export const CRI_API_VERSION = 'v1';
export const RUNTIME_NAME = 'kata-ts';

export function versionResponse(): VersionResponse {
  return {
    // The kubelet sends its own API version; upstream runtimes answer with a fixed "0.1.0" here.
    version: '0.1.0',
    runtime_name: RUNTIME_NAME,
    runtime_version: packageVersion(),
    runtime_api_version: CRI_API_VERSION,
  };
}

/**
 * Status: RuntimeReady reflects whether a pod VM can be started at all (QEMU and the guest kernel
 * and initramfs are present); NetworkReady whether pods can get a network: a valid CNI config
 * whose plugins all exist (the reason names what is missing otherwise; see networkReadiness).
 */
export function statusResponse(
  config: KataConfig,
  facts: RuntimeFacts,
  request: StatusRequest__Output,
  network: NetworkReadiness = { ready: false, reason: 'NetworkNotChecked', message: 'pod networking was not checked' },
): StatusResponse {
  const runtimeProblems = [facts.qemu, facts.guestAssets].filter((c) => !c.ok).map((c) => c.message);
  const handlerNames = Object.keys(config.handlers).sort();
  // The kubelet looks the pod's RuntimeClass handler up in this list; "" is how it names the
  // default handler (a pod without a RuntimeClass), so the default appears again under "".
  // Recursive read-only mounts: every host mount below the volume is made read-only as well
  // (src/runtime/container/shared-dir.ts), and the guest sees the volume as a single mount.
  const handlerFeatures = { recursive_read_only_mounts: true, user_namespaces: false };
  const runtimeHandlers = [{ name: '', features: handlerFeatures }, ...handlerNames.map((name) => ({ name, features: handlerFeatures }))];
  const response: StatusResponse = {
    status: {
      conditions: [
        {
          type: 'RuntimeReady',
          status: runtimeProblems.length === 0,
          reason: runtimeProblems.length === 0 ? '' : 'VmPrerequisitesMissing',
          message: runtimeProblems.join('; '),
        },
        { type: 'NetworkReady', status: network.ready, reason: network.reason, message: network.message },
      ],
    },
    runtime_handlers: runtimeHandlers,
    // The OCI spec honours Strict and Merge, and ContainerStatus reports the groups it gave.
    features: { supplemental_groups_policy: true, user_namespaces_host_network: false },
    info: {},
  };
  if (request.verbose) {
    response.info = {
      config: JSON.stringify({ path: facts.configPath, socketPath: config.socketPath, stateDir: config.stateDir }),
      handlers: JSON.stringify(
        Object.fromEntries(
          handlerNames.map((n) => {
            const h = config.handlers[n]!;
            return [n, { default: n === config.defaultHandler, confidential: h.confidential, description: h.description }];
          }),
        ),
      ),
      acceleration: JSON.stringify(facts.acceleration),
      cgroupDriver: JSON.stringify(facts.cgroupDriver),
      qemu: JSON.stringify(facts.qemu),
      guestAssets: JSON.stringify(facts.guestAssets),
      network: JSON.stringify({ ...config.network, ready: network.ready, message: network.message }),
    };
  }
  return response;
}

/**
 * RuntimeConfig (KEP-4033): the kubelet adopts the cgroup driver named here, so it must be the
 * very driver the runtime places VMMs with. CGROUPFS is always written explicitly, because the
 * enum's zero value is SYSTEMD and an omitted field would read as systemd.
 */
export function runtimeConfigResponse(facts: RuntimeFacts): RuntimeConfigResponse {
  return { linux: { cgroup_driver: facts.cgroupDriver.name === 'systemd' ? 'SYSTEMD' : 'CGROUPFS' } };
}

/** UpdateRuntimeConfig only carries the pod CIDR, which kata-ts has no use for yet: logged, accepted. */
export function updateRuntimeConfig(request: UpdateRuntimeConfigRequest__Output, ctx: CallContext): Record<string, never> {
  ctx.logger.info({ podCidr: request.runtime_config?.network_config?.pod_cidr ?? '' }, 'runtime config update received');
  return {};
}
