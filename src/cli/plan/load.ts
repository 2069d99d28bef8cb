import { invalid } from '../../common/errors.js';
import { parseProtoJson } from '../../cri/protojson.js';
import { type ConvertOptions, manifestToRunPodSandboxRequest } from '../../manifest/convert.js';
import { parseYamlDocument } from '../../manifest/parse.js';
import { looksLikeKubernetesObject } from '../../manifest/pod.js';
import type { RunPodSandboxRequestInput } from '../../sizing/input.js';

/** The two spellings `kata-ts plan --request` accepts. */
export type RequestForm = 'manifest' | 'protojson';

export interface LoadedPlanRequest {
  form: RequestForm;
  request: RunPodSandboxRequestInput;
}

/**
 * Read a plan request from file text: a Kubernetes Pod manifest (YAML or JSON, recognised by its
 * `kind`/`apiVersion`) converted as a KEP-4112 kubelet would, or a RunPodSandboxRequest in proto3
 * JSON decoded exactly as the gRPC server would decode it. Pure: the caller reads the file.
 */
export function loadPlanRequest(text: string, source: string, options: ConvertOptions = {}): LoadedPlanRequest {
  const doc = parseYamlDocument(text, source);
  if (looksLikeKubernetesObject(doc)) {
    return { form: 'manifest', request: manifestToRunPodSandboxRequest(doc, options) };
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) {
    throw invalid('PLAN_REQUEST_UNRECOGNISED', `${source} is neither a Pod manifest nor a RunPodSandboxRequest (proto3 JSON object)`);
  }
  const trimmed = text.trimStart();
  if (!trimmed.startsWith('{')) {
    throw invalid(
      'PLAN_REQUEST_UNRECOGNISED',
      `${source} has no kind/apiVersion, so it must be a RunPodSandboxRequest in proto3 JSON, not YAML`,
    );
  }
  const request = parseProtoJson<RunPodSandboxRequestInput>('runtime.v1.RunPodSandboxRequest', text, source);
  if (request.config === null || request.config === undefined) {
    throw invalid('PLAN_REQUEST_UNRECOGNISED', `${source} is a RunPodSandboxRequest without a config`);
  }
  return { form: 'protojson', request };
}
