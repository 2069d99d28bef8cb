import { invalid } from '../../common/errors.js';
import type { PodSandboxConfig__Output } from '../../generated/runtime/v1/PodSandboxConfig.js';
import type { SandboxRecord } from './record.js';

/**
 * The parts of RunPodSandboxRequest that must be present before anything is planned: the config
 * and the pod's identity. Everything about sizes and devices is checked by the planners.
 */
export function validateRunRequest(config: PodSandboxConfig__Output | null): {
  config: PodSandboxConfig__Output;
  metadata: SandboxRecord['metadata'];
} {
  if (config === null) throw invalid('SANDBOX_CONFIG_MISSING', 'config is required in RunPodSandboxRequest');
  const m = config.metadata;
  if (m === null) throw invalid('SANDBOX_METADATA_MISSING', 'config.metadata is required');
  for (const field of ['name', 'namespace', 'uid'] as const) {
    if (m[field] === '') throw invalid('SANDBOX_METADATA_INVALID', `config.metadata.${field} must not be empty`);
  }
  return { config, metadata: { name: m.name, uid: m.uid, namespace: m.namespace, attempt: m.attempt } };
}
