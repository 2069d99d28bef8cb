import { readFile } from 'node:fs/promises';
import { errnoCode, invalid, notFound } from '../../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../../common/schema.js';

/**
 * The registries file (config key `images.registriesConfigPath`), JSON:
 *
 * ```json
 * { "registries": {
 *     "docker.io":      { "mirrors": ["127.0.0.1:5001", "https://mirror.example.com"] },
 *     "localhost:5000": { "plainHttp": true },
 *     "127.0.0.1:*":    { "plainHttp": true },
 *     "*.corp.example": { "skipTlsVerify": true } } }
 * ```
 *
 * Keys are host patterns: an exact `host[:port]`, `host:*` (that host on any port or none), or
 * `*.domain` (any subdomain, any port). The most specific match wins (exact, then `host:*`, then
 * the longest `*.` suffix). Settings apply to whichever host is contacted, mirrors included.
 */
export interface RegistryHostSettings {
  /** Tried in order before the registry itself; `host[:port]` or an `http(s)://` URL. */
  mirrors: string[];
  /** Speak plain HTTP instead of HTTPS. */
  plainHttp: boolean;
  /** Accept any TLS certificate (self-signed test registries). */
  skipTlsVerify: boolean;
}

export interface RegistriesConfig {
  /** Host pattern -> settings, as written in the file. */
  registries: Record<string, Partial<RegistryHostSettings>>;
}

const HOST_PATTERN = '^(?:\\*\\.)?[A-Za-z0-9.\\-\\[\\]:]+(?::(?:[0-9]{1,5}|\\*))?$';
const MIRROR = '^(?:https?://)?[A-Za-z0-9.\\-\\[\\]:]+(?::[0-9]{1,5})?/?$';

export const registriesConfigSchema = {
  $id: 'https://kata-ts.dev/schemas/registries.json',
  type: 'object',
  additionalProperties: false,
  required: ['registries'],
  properties: {
    registries: {
      type: 'object',
      propertyNames: { pattern: HOST_PATTERN, maxLength: 262 },
      additionalProperties: {
        type: 'object',
        additionalProperties: false,
        properties: {
          mirrors: { type: 'array', items: { type: 'string', pattern: MIRROR } },
          plainHttp: { type: 'boolean' },
          skipTlsVerify: { type: 'boolean' },
        },
      },
    },
  },
} as const;

const validateRegistries = compileOnce<RegistriesConfig>(registriesConfigSchema);

/** Validate a parsed registries document; INVALID lists every problem with its JSON pointer. */
export function parseRegistriesConfig(doc: unknown, source: string): RegistriesConfig {
  const validate = validateRegistries();
  if (!validate(doc)) {
    // ajv reports a bad key through `propertyName`, which the generic describer does not name.
    const errors = validate.errors ?? [];
    const badKeys = errors
      .filter((e) => e.propertyName !== undefined && e.keyword !== 'propertyNames')
      .map((e) => `${e.instancePath} key ${JSON.stringify(e.propertyName)} is not a host pattern (host[:port], host:* or *.domain)`);
    const problems = [
      ...new Set(badKeys),
      ...describeSchemaErrors(errors.filter((e) => e.propertyName === undefined && e.keyword !== 'propertyNames')),
    ];
    throw invalid('REGISTRIES_CONFIG_INVALID', `registries config ${source} is invalid: ${problems.join('; ')}`, {
      details: { problems },
    });
  }
  return doc;
}

/** Read the registries file; a null path means "no file": every registry uses HTTPS, no mirrors. */
export async function loadRegistriesConfig(file: string | null): Promise<RegistriesConfig> {
  if (file === null) return { registries: {} };
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') {
      throw notFound('REGISTRIES_CONFIG_NOT_FOUND', `images.registriesConfigPath ${file} does not exist`);
    }
    throw invalid('REGISTRIES_CONFIG_UNREADABLE', `images.registriesConfigPath ${file} cannot be read`, { cause: err });
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw invalid('REGISTRIES_CONFIG_INVALID', `registries config ${file} is not valid JSON: ${(err as Error).message}`);
  }
  return parseRegistriesConfig(doc, file);
}

function splitHostPort(hostPort: string): { host: string; port: string | undefined } {
  const m = /^(\[[^\]]+\]|[^:]+)(?::([0-9]+))?$/.exec(hostPort);
  if (m === null) return { host: hostPort, port: undefined };
  return { host: m[1] ?? hostPort, port: m[2] };
}

/** How specific a pattern's match on `hostPort` is (higher wins), or -1 for no match. */
function matchRank(pattern: string, hostPort: string): number {
  if (pattern === hostPort) return 3_000;
  const { host } = splitHostPort(hostPort);
  if (pattern.endsWith(':*') && pattern.slice(0, -2) === host) return 2_000;
  if (pattern.startsWith('*.')) {
    const patternHost = pattern.endsWith(':*') ? pattern.slice(2, -2) : pattern.slice(2);
    if (host.endsWith(`.${patternHost}`)) return 1_000 + patternHost.length;
  }
  return -1;
}

/** The settings that apply to `hostPort` (defaults: HTTPS, verified TLS, no mirrors). */
export function settingsFor(config: RegistriesConfig, hostPort: string): RegistryHostSettings {
  let best: Partial<RegistryHostSettings> | undefined;
  let bestRank = -1;
  for (const [pattern, settings] of Object.entries(config.registries)) {
    const rank = matchRank(pattern, hostPort);
    if (rank > bestRank) {
      best = settings;
      bestRank = rank;
    }
  }
  return {
    mirrors: best?.mirrors ?? [],
    plainHttp: best?.plainHttp ?? false,
    skipTlsVerify: best?.skipTlsVerify ?? false,
  };
}
