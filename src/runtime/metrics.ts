import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import { invalid } from '../common/errors.js';
import type { Logger } from '../common/logger.js';

/** Per-daemon Prometheus metrics (a registry of its own, so several servers can live in one test). */
export class RuntimeMetrics {
  readonly registry = new Registry();
  readonly requests: Counter<'method' | 'code'>;
  readonly latency: Histogram<'method'>;
  readonly sandboxes: Gauge<'state'>;

  constructor() {
    this.requests = new Counter({
      name: 'kata_ts_grpc_requests_total',
      help: 'CRI requests handled, by method and gRPC status code.',
      labelNames: ['method', 'code'],
      registers: [this.registry],
    });
    this.latency = new Histogram({
      name: 'kata_ts_grpc_request_duration_seconds',
      help: 'CRI request latency by method.',
      labelNames: ['method'],
      // Sandbox starts take seconds (a VM boots); status calls take microseconds.
      buckets: [0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
      registers: [this.registry],
    });
    this.sandboxes = new Gauge({
      name: 'kata_ts_sandboxes',
      help: 'Pod sandboxes known to the runtime, by state.',
      labelNames: ['state'],
      registers: [this.registry],
    });
    collectDefaultMetrics({ register: this.registry, prefix: 'kata_ts_' });
  }

  observe(method: string, code: string, seconds: number): void {
    this.requests.inc({ method, code });
    this.latency.observe({ method }, seconds);
  }
}

export interface MetricsEndpoint {
  /** `host:port` actually bound (the port is chosen by the kernel when 0 was asked). */
  address: string;
  close(): Promise<void>;
}

/** Serve `/metrics` on `host:port`. Only loopback hosts are accepted: metrics are not for the network. */
export async function serveMetrics(address: string, metrics: RuntimeMetrics, logger: Logger): Promise<MetricsEndpoint> {
  const at = address.lastIndexOf(':');
  const host = address.slice(0, at);
  const port = Number(address.slice(at + 1));
  if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(host) || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw invalid('METRICS_ADDRESS', `metricsAddress "${address}" must be a loopback host:port such as 127.0.0.1:9464`);
  }
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404).end('not found\n');
      return;
    }
    metrics.registry.metrics().then(
      (body) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(body),
      (err: unknown) => {
        logger.error({ err }, 'metrics collection failed');
        res.writeHead(500).end('metrics collection failed\n');
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host.replace(/^\[|\]$/g, ''), () => resolve());
  });
  const bound = server.address() as AddressInfo;
  const actual = `${host}:${bound.port}`;
  logger.info({ address: actual }, 'metrics endpoint listening');
  return {
    address: actual,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
