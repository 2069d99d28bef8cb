import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { timedOut, unavailable } from '../common/errors.js';
import { packageRoot } from '../common/paths.js';

/** Decoded `v1.PodResources` (keepCase, defaults filled): only the fields kata-ts reads are typed. */
export interface KubeletPodResources {
  name: string;
  namespace: string;
  containers: Array<{
    name: string;
    devices: Array<{ resource_name: string; device_ids: string[] }>;
    dynamic_resources: Array<{
      claim_name: string;
      claim_namespace: string;
      claim_resources: Array<{ cdi_devices: Array<{ name: string }>; driver_name: string; pool_name: string; device_name: string }>;
    }>;
  }>;
}

/** proto-loader options: the same spelling as the CRI objects (snake_case, defaults filled). */
export const PODRESOURCES_LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true } as const;

export function podResourcesProtoPath(): string {
  return path.join(packageRoot(), 'proto', 'podresources.proto');
}

type Unary<Req, Res> = (
  req: Req,
  options: grpc.CallOptions,
  cb: (err: grpc.ServiceError | null, res?: Res) => void,
) => grpc.ClientUnaryCall;

interface ListerClient extends grpc.Client {
  Get: Unary<{ pod_name: string; pod_namespace: string }, { pod_resources: KubeletPodResources | null }>;
  List: Unary<Record<string, never>, { pod_resources: KubeletPodResources[] }>;
}

interface LoadedApi {
  definition: protoLoader.PackageDefinition;
  Lister: grpc.ServiceClientConstructor;
}

let loaded: LoadedApi | undefined;

/** Load proto/podresources.proto once; also what a test server registers. */
export function loadPodResourcesApi(): LoadedApi {
  if (loaded !== undefined) return loaded;
  const definition = protoLoader.loadSync(podResourcesProtoPath(), PODRESOURCES_LOADER_OPTIONS);
  const pkg = grpc.loadPackageDefinition(definition) as unknown as { v1: { PodResourcesLister: grpc.ServiceClientConstructor } };
  loaded = { definition, Lister: pkg.v1.PodResourcesLister };
  return loaded;
}

export interface PodResourcesQueryOptions {
  /** Deadline for each call. */
  timeoutMs: number;
}

function call<Req, Res>(client: ListerClient, method: Unary<Req, Res>, req: Req, timeoutMs: number): Promise<Res> {
  return new Promise((resolve, reject) => {
    method.call(client, req, { deadline: Date.now() + timeoutMs }, (err, res) => (err ? reject(err) : resolve(res as Res)));
  });
}

function mapError(err: unknown, socketPath: string, timeoutMs: number): never {
  const e = err as grpc.ServiceError;
  if (e.code === grpc.status.DEADLINE_EXCEEDED) {
    throw timedOut('KUBELET_PODRESOURCES_TIMEOUT', `kubelet PodResources API at ${socketPath} did not answer within ${timeoutMs} ms`, {
      cause: err,
    });
  }
  throw unavailable('KUBELET_PODRESOURCES_UNAVAILABLE', `kubelet PodResources API at ${socketPath} could not be queried`, { cause: err });
}

/**
 * Ask the kubelet which devices it assigned to a pod: `Get` (namespace/name), falling back to
 * `List` on kubelets without the KubeletPodResourcesGet feature (UNIMPLEMENTED). A pod the
 * kubelet does not know gives null. Kata does the same when cold-plugging VFIO devices.
 */
export async function getKubeletPodResources(
  socketPath: string,
  namespace: string,
  name: string,
  options: PodResourcesQueryOptions,
): Promise<KubeletPodResources | null> {
  const { Lister } = loadPodResourcesApi();
  const client = new Lister(`unix:${socketPath}`, grpc.credentials.createInsecure(), {
    // The kubelet's own clients allow 16 MiB answers: List on a big node is large.
    'grpc.max_receive_message_length': 16 * 1024 * 1024,
  }) as unknown as ListerClient;
  try {
    try {
      const res = await call(client, client.Get, { pod_name: name, pod_namespace: namespace }, options.timeoutMs);
      return res.pod_resources;
    } catch (err) {
      const code = (err as grpc.ServiceError).code;
      if (code === grpc.status.NOT_FOUND) return null;
      if (code !== grpc.status.UNIMPLEMENTED) mapError(err, socketPath, options.timeoutMs);
    }
    try {
      const res = await call(client, client.List, {}, options.timeoutMs);
      return res.pod_resources.find((p) => p.name === name && p.namespace === namespace) ?? null;
    } catch (err) {
      mapError(err, socketPath, options.timeoutMs);
    }
  } finally {
    client.close();
  }
}
