import { invalid } from '../../common/errors.js';
import type { Logger } from '../../common/logger.js';
import { type Digest, sha256Digest } from '../digest.js';
import { type ImageReference, registryApiHost, repositoryOf } from '../reference.js';
import type { Credentials } from './auth.js';
import { type RegistriesConfig, settingsFor } from './config.js';
import { AgentPool, type HttpResponse, readBody } from './http.js';
import { MANIFEST_ACCEPT } from './manifests.js';
import { type Endpoint, RegistrySession } from './session.js';

/** containerd's limit: a manifest or index above 4 MiB is refused rather than buffered. */
export const MANIFEST_LIMIT_BYTES = 4 * 1024 * 1024;

export interface FetchedManifest {
  bytes: Buffer;
  /** sha256 of `bytes` (verified against the request when it named a digest). */
  digest: Digest;
  /** Content-Type as served, without parameters. */
  contentType: string;
}

export interface RegistryClientOptions {
  registries: RegistriesConfig;
  logger: Logger;
  userAgent?: string;
}

/**
 * The distribution-API v2 client: decides where a repository is fetched from (mirrors from the
 * registries file, plain HTTP or unverified TLS where configured) and hands out per-pull
 * sessions sharing one connection pool.
 */
export class RegistryClient {
  private readonly agents = new AgentPool();

  constructor(private readonly opts: RegistryClientOptions) {}

  /** The endpoints tried for `domain`, mirrors first; exported for tests and verbose output. */
  endpointsFor(domain: string): Endpoint[] {
    const settings = settingsFor(this.opts.registries, domain);
    const endpoints: Endpoint[] = settings.mirrors.map((mirror) => {
      const explicit = /^https?:\/\//.test(mirror);
      const host = explicit ? new URL(mirror).host : mirror.replace(/\/$/, '');
      const own = settingsFor(this.opts.registries, host);
      const origin = explicit ? new URL(new URL(mirror).origin) : new URL(`${own.plainHttp ? 'http' : 'https'}://${host}`);
      return { origin, skipTlsVerify: own.skipTlsVerify, mirror: true };
    });
    const apiHost = registryApiHost(domain);
    endpoints.push({
      origin: new URL(`${settings.plainHttp ? 'http' : 'https'}://${apiHost}`),
      skipTlsVerify: settings.skipTlsVerify,
      mirror: false,
    });
    return endpoints;
  }

  /** A session for one repository; credentials are matched per endpoint inside. */
  session(ref: ImageReference, credentials: Credentials | undefined): ImageSession {
    return new ImageSession(
      new RegistrySession({
        endpoints: this.endpointsFor(ref.domain),
        domain: ref.domain,
        repository: ref.path,
        credentials,
        agents: this.agents,
        skipTlsVerifyFor: (host) => settingsFor(this.opts.registries, host).skipTlsVerify,
        logger: this.opts.logger,
        userAgent: this.opts.userAgent ?? 'kata-ts',
      }),
      repositoryOf(ref),
    );
  }

  /** Close pooled keep-alive connections. */
  close(): void {
    this.agents.destroy();
  }
}

/** Manifest and blob reads for one repository. */
export class ImageSession {
  constructor(
    private readonly session: RegistrySession,
    /** `docker.io/library/busybox`, for messages. */
    readonly repository: string,
  ) {}

  /** Fetch a manifest or index by tag or digest; a digest reference is verified. */
  async getManifest(reference: string, signal: AbortSignal): Promise<FetchedManifest> {
    const what = `manifest ${reference} of ${this.repository}`;
    const res = await this.session.get(`manifests/${reference}`, {
      accept: MANIFEST_ACCEPT,
      signal,
      what,
      notFoundReason: 'IMAGE_NOT_FOUND',
    });
    const bytes = await readBody(res, MANIFEST_LIMIT_BYTES, what, signal);
    const digest = sha256Digest(bytes);
    if (reference.startsWith('sha256:') && digest !== reference) {
      throw invalid('IMAGE_DIGEST_MISMATCH', `${what} has digest ${digest}, not the requested ${reference}`, {
        details: { expected: reference, actual: digest },
      });
    }
    const contentType =
      String(res.headers['content-type'] ?? '')
        .split(';')[0]
        ?.trim() ?? '';
    return { bytes, digest, contentType };
  }

  /** Open a blob for streaming; the caller verifies its digest while reading. */
  async openBlob(digest: Digest, signal: AbortSignal): Promise<HttpResponse> {
    return this.session.get(`blobs/${digest}`, {
      signal,
      what: `blob ${digest} of ${this.repository}`,
      notFoundReason: 'IMAGE_BLOB_NOT_FOUND',
    });
  }
}
