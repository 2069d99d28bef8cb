import { promises as fsp } from 'node:fs';
import {
  status as GrpcStatus,
  type MethodDefinition,
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceDefinition,
  type sendUnaryData,
  type UntypedServiceImplementation,
} from '@grpc/grpc-js';
import { cancelled, invalid, isKataError, unimplemented } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { RequestContext } from '../runtime/context.js';
import type { RuntimeMetrics } from '../runtime/metrics.js';
import type { ImageRpcHandlers, RuntimeRpcHandlers, RuntimeStreamHandlers } from './rpcs.js';
import { prepareSocketPath } from './socket.js';
import { statusName, toServiceError } from './status.js';

/**
 * The largest request body the server reads (bytes, after decompression). Larger ones are
 * answered RESOURCE_EXHAUSTED by grpc-js from the length prefix, before the body is buffered or
 * decoded. 16 MiB is what the kubelet's CRI client sends at most (and containerd's CRI server
 * reads): a smaller cap would refuse requests the kubelet really sends, such as a CreateContainer
 * whose environment expands several ConfigMaps (1 MiB each); the fields inside are bounded by the
 * decoders (src/runtime/spec/names.ts).
 */
export const MAX_REQUEST_BYTES = 16 * 1024 * 1024;

/** What a handler learns about the call besides the request (the runtime's RequestContext). */
export type CallContext = RequestContext;

/** Any unary handler, as the server calls it: it only passes on what grpc-js decoded. */
type UnaryHandler = (request: never, ctx: CallContext) => Promise<unknown>;

/**
 * A service to serve with its handlers, typed by the generated service definition: every unary
 * rpc has its handler (src/cri/rpcs.ts). Streaming rpcs answer UNIMPLEMENTED.
 */
export type ServiceBinding =
  | { name: 'runtime.v1.RuntimeService'; definition: ServiceDefinition; handlers: RuntimeRpcHandlers; streams?: RuntimeStreamHandlers }
  | { name: 'runtime.v1.ImageService'; definition: ServiceDefinition; handlers: ImageRpcHandlers };

export interface CriServerOptions {
  socketPath: string;
  services: ServiceBinding[];
  logger: Logger;
  metrics: RuntimeMetrics;
}

export interface CriServer {
  socketPath: string;
  /** Stop accepting calls, let running ones finish for up to `graceMs`, then cut them. */
  close(graceMs?: number): Promise<void>;
}

/** Marks a request body that protobuf could not decode, so the handler layer can answer precisely. */
const UNDECODABLE = Symbol('undecodable');
interface Undecodable {
  [UNDECODABLE]: string;
}
function isUndecodable(v: unknown): v is Undecodable {
  return typeof v === 'object' && v !== null && UNDECODABLE in v;
}

/**
 * grpc-js answers an undecodable body with a bare INTERNAL. Wrapping the deserializer lets us
 * answer INVALID_ARGUMENT with the message type and protobuf's own explanation instead.
 */
function withTolerantDecoding(definition: ServiceDefinition): ServiceDefinition {
  const out: Record<string, MethodDefinition<unknown, unknown>> = {};
  for (const [name, method] of Object.entries(definition)) {
    const decode = method.requestDeserialize;
    out[name] = {
      ...method,
      requestDeserialize: (bytes: Buffer): unknown => {
        try {
          return decode(bytes);
        } catch (err) {
          return { [UNDECODABLE]: err instanceof Error ? err.message : String(err) } satisfies Undecodable;
        }
      },
    };
  }
  return out as ServiceDefinition;
}

/** The sandbox or container a request or response names, for the request log line. */
function objectIds(value: unknown): Record<string, string> {
  const ids: Record<string, string> = {};
  if (typeof value !== 'object' || value === null) return ids;
  const v = value as Record<string, unknown>;
  for (const key of ['pod_sandbox_id', 'container_id'] as const) {
    // Bounded: the log line is one line per request even for a request carrying a 200 KB "id".
    if (typeof v[key] === 'string' && v[key] !== '') ids[key === 'pod_sandbox_id' ? 'sandboxId' : 'containerId'] = v[key].slice(0, 128);
  }
  return ids;
}

function deadlineOf(call: { getDeadline(): Date | number }): number | undefined {
  const d = call.getDeadline();
  const ms = d instanceof Date ? d.getTime() : d;
  return Number.isFinite(ms) ? ms : undefined;
}

function unaryImplementation(
  method: string,
  typeName: string,
  handler: UnaryHandler | undefined,
  opts: CriServerOptions,
): (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => void {
  return (call, callback) => {
    const started = process.hrtime.bigint();
    // The child logger carries `rpc`; these fields join it on the completion line.
    const fields: Record<string, unknown> = { ...objectIds(call.request) };
    const logger = opts.logger.child({ rpc: method });
    const controller = new AbortController();
    const deadlineMs = deadlineOf(call);
    call.on('cancelled', () => controller.abort(cancelled('CALL_CANCELLED', `${method} was cancelled by the client`)));
    const ctx: CallContext = {
      method,
      logger,
      signal: controller.signal,
      deadlineMs,
      annotate: (extra) => Object.assign(fields, extra),
    };
    const run = async (): Promise<unknown> => {
      if (isUndecodable(call.request)) {
        throw invalid('REQUEST_UNDECODABLE', `request body is not a valid ${typeName}: ${call.request[UNDECODABLE]}`);
      }
      if (handler === undefined) {
        throw unimplemented('RPC_UNIMPLEMENTED', `${method} is not implemented by kata-ts yet`);
      }
      return handler(call.request as never, ctx);
    };
    run().then(
      (response) => {
        Object.assign(fields, objectIds(response));
        finish(GrpcStatus.OK);
        callback(null, response);
      },
      (err: unknown) => {
        const se = toServiceError(err);
        finish(se.code, err);
        callback(se);
      },
    );
    function finish(code: GrpcStatus, err?: unknown): void {
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      const codeName = statusName(code);
      opts.metrics.observe(method, codeName, seconds);
      const line = { ...fields, code: codeName, durationMs: Math.round(seconds * 1e6) / 1e3 };
      if (err === undefined) logger.info(line, 'request done');
      else if (isKataError(err) && err.kind !== 'internal')
        logger.warn({ ...line, reason: err.reason, err: err.message }, 'request refused');
      else logger.error({ ...line, err }, 'request failed');
    }
  };
}

/** Streaming rpcs are registered too, so a client gets a clear UNIMPLEMENTED rather than a 404-like error. */
function streamingImplementation(method: string, opts: CriServerOptions): (call: ServerWritableStream<unknown, unknown>) => void {
  return (call) => {
    opts.metrics.observe(method, 'UNIMPLEMENTED', 0);
    opts.logger.info({ rpc: method, code: 'UNIMPLEMENTED' }, 'request done');
    call.emit('error', toServiceError(unimplemented('RPC_UNIMPLEMENTED', `${method} is not implemented by kata-ts yet`)));
  };
}

type StreamHandler = (request: never, send: (response: unknown) => boolean, ctx: CallContext) => Promise<void>;

/** A server-streaming rpc with its handler: runs until the handler resolves or the client goes. */
function serverStreamImplementation(
  method: string,
  handler: StreamHandler,
  opts: CriServerOptions,
): (call: ServerWritableStream<unknown, unknown>) => void {
  return (call) => {
    const logger = opts.logger.child({ rpc: method });
    const controller = new AbortController();
    call.on('cancelled', () => controller.abort(cancelled('CALL_CANCELLED', `${method} was cancelled by the client`)));
    const ctx: CallContext = { method, logger, signal: controller.signal, deadlineMs: deadlineOf(call), annotate: () => undefined };
    logger.info('stream opened');
    const run = async (): Promise<void> => {
      if (isUndecodable(call.request))
        throw invalid('REQUEST_UNDECODABLE', `request body of ${method} is not valid: ${call.request[UNDECODABLE]}`);
      await handler(call.request as never, (response) => call.write(response), ctx);
    };
    run().then(
      () => {
        opts.metrics.observe(method, 'OK', 0);
        if (!controller.signal.aborted) call.end();
        logger.info({ code: 'OK' }, 'stream done');
      },
      (err: unknown) => {
        const se = toServiceError(err);
        opts.metrics.observe(method, statusName(se.code), 0);
        logger.warn({ code: statusName(se.code), err: err instanceof Error ? err.message : String(err) }, 'stream failed');
        if (!controller.signal.aborted) call.emit('error', se);
      },
    );
  };
}

/** The handlers of a binding by rpc name, as the server looks them up from the service definition. */
function handlersByName(binding: ServiceBinding): Readonly<Record<string, UnaryHandler | undefined>> {
  return binding.handlers;
}

function implementService(binding: ServiceBinding, opts: CriServerOptions): UntypedServiceImplementation {
  const impl: UntypedServiceImplementation = {};
  const handlers = handlersByName(binding);
  const streams: Readonly<Record<string, StreamHandler | undefined>> =
    binding.name === 'runtime.v1.RuntimeService' ? (binding.streams ?? {}) : {};
  for (const [name, method] of Object.entries(binding.definition)) {
    const typeName = (method as { requestType?: { type?: { name?: string } } }).requestType?.type?.name ?? `${name}Request`;
    const stream = streams[name];
    if (!method.requestStream && method.responseStream && stream !== undefined) {
      impl[name] = serverStreamImplementation(name, stream, opts) as never;
    } else if (method.requestStream || method.responseStream) {
      impl[name] = streamingImplementation(name, opts) as never;
    } else {
      impl[name] = unaryImplementation(name, typeName, handlers[name], opts) as never;
    }
  }
  return impl;
}

/**
 * Start the CRI gRPC server on a unix socket (mode 0660). Every rpc of every bound service is
 * registered: implemented ones run their handler, the rest answer UNIMPLEMENTED with a sentence.
 */
export async function startCriServer(opts: CriServerOptions): Promise<CriServer> {
  await prepareSocketPath(opts.socketPath, opts.logger);
  const server = new Server({
    'grpc.max_receive_message_length': MAX_REQUEST_BYTES,
    // The kubelet's CRI client accepts 16 MiB answers too, so large ListContainers answers pass.
    'grpc.max_send_message_length': 16 * 1024 * 1024,
  });
  for (const binding of opts.services) {
    server.addService(withTolerantDecoding(binding.definition), implementService(binding, opts));
  }
  await new Promise<void>((resolve, reject) => {
    server.bindAsync(`unix:${opts.socketPath}`, ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve()));
  });
  await fsp.chmod(opts.socketPath, 0o660);
  opts.logger.info({ socketPath: opts.socketPath }, 'CRI server listening');
  return {
    socketPath: opts.socketPath,
    close: async (graceMs = 5000) => {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
      await fsp.rm(opts.socketPath, { force: true });
    },
  };
}
