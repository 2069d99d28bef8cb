/**
 * The guest's attester: the one object the agent holds for attestation. It reads the broker a
 * pod's initdata names (config.ts) once, attests at pod start in the background when there is
 * one (start), and fetches resources for the agent's callers (resource: CreateContainer of a
 * container that asks for secrets), attesting first when it has no live session. A pod whose
 * initdata names no broker has attestation off, and every resource request is refused saying so.
 *
 * Resources are handed to the caller in memory and nowhere else; the attester logs their names
 * and lengths, never their bytes.
 */
import { readFileSync } from 'node:fs';
import { errnoCode, isKataError, type KataError, precondition } from '../../../src/common/errors.js';
import type { Logger } from '../../../src/common/logger.js';
import type { TpmTransport } from '../tpm.js';
import { GUEST_INITDATA_PATH } from '../tpm-initdata.js';
import { AttestClient, type AttestClientState, parseResourceName, type RetryPolicy } from './client.js';
import { type AttestConfig, attestConfigFromDocument } from './config.js';
import type { EvidenceSource } from './evidence.js';
import { type BrokerTransport, httpsTransport } from './http.js';
import './reasons.js';
import { tpmOpsOverTransport } from './tpm-ops.js';
import { GUEST_EVENT_LOG_PATH, tpmEvidenceSource } from './tpm-source.js';

export { parseResourceName } from './client.js';
export type { BrokerConfig } from './config.js';

/** `off`: no broker named (or its configuration is invalid: see lastError); else the client's state. */
export type AttesterState = 'off' | AttestClientState;

export interface AttesterStatus {
  state: AttesterState;
  /** The broker's URL, or null when attestation is off. */
  broker: string | null;
  /** The last failure (reason code and message), or null. */
  lastError: { reason: string; message: string } | null;
  /** The reference sets the broker's token says this guest matched (as the broker said; not verified here). */
  matched?: string[];
  /** When the live session was made (the `now` clock), if there is one. */
  attestedAtMs?: number;
}

export interface Attester {
  /** Attests in the background when a broker is named; never throws (failures show in status). */
  start(): void;
  status(): AttesterStatus;
  /**
   * The broker may be reachable now (the agent calls it when the pod network is configured): a
   * request waiting out its backoff is retried at once. Does nothing when attestation is off.
   */
  nudge(): void;
  /**
   * The resource `name` (`kbs:///repo/type/tag` or `repo/type/tag`), decrypted, in memory.
   * Throws a KataError: ATTEST_OFF (no broker named), ATTEST_CONFIG_INVALID (naming the key),
   * ATTEST_RESOURCE_PATH_INVALID, ATTEST_BROKER_UNREACHABLE, ATTEST_REFUSED (evidence refused,
   * with the broker's detail), ATTEST_RESOURCE_REFUSED (naming the resource, with the broker's
   * detail), ATTEST_EVIDENCE_FAILED.
   */
  resource(name: string): Promise<Buffer>;
}

export interface AttesterOptions {
  /** Opens the guest's TPM (guest/agent/tpm-device.ts openTpmDevice); one channel per attestation. */
  openTpm: () => Promise<TpmTransport>;
  /** The published initdata (/run/kata-ts/initdata.toml). */
  initdataPath?: string;
  /** The firmware's event log (securityfs). */
  eventLogPath?: string;
  log: Logger;
  now?: () => number;
  /** Tests: another way to reach the broker than node:https, another evidence source, shorter retries. */
  transport?: BrokerTransport;
  evidence?: EvidenceSource;
  retry?: RetryPolicy;
  sleep?: (ms: number) => Promise<void>;
  keyKind?: 'EC-P256' | 'RSA';
}

/** Reads the published initdata and its broker; never throws (an invalid one is kept as the error). */
function loadConfig(initdataPath: string): { config: AttestConfig | null; error: KataError | null } {
  let document: Buffer;
  try {
    document = readFileSync(initdataPath);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return { config: { kind: 'no-initdata' }, error: null };
    return {
      config: null,
      error: precondition('ATTEST_CONFIG_INVALID', `cannot read the initdata at ${initdataPath}: ${(err as Error).message}`, {
        cause: err,
      }),
    };
  }
  try {
    return { config: attestConfigFromDocument(document), error: null };
  } catch (err) {
    if (isKataError(err)) return { config: null, error: err };
    throw err;
  }
}

/** The attester of this guest (see the file's comment). */
export function createAttester(o: AttesterOptions): Attester {
  const initdataPath = o.initdataPath ?? GUEST_INITDATA_PATH;
  const log = o.log.child({ component: 'attester' });
  const { config, error } = loadConfig(initdataPath);
  if (error !== null)
    log.error({ reason: error.reason, err: error.message }, 'attestation off: the initdata names a broker that cannot be used');

  let client: AttestClient | null = null;
  if (config?.kind === 'broker') {
    const { broker, initdata } = config;
    client = new AttestClient({
      broker,
      transport: o.transport ?? httpsTransport({ url: broker.url, caPem: broker.caPem }),
      evidence:
        o.evidence ??
        tpmEvidenceSource({
          openTpm: async () => tpmOpsOverTransport(await o.openTpm()),
          initdataDocument: initdata.document,
          eventLogPath: o.eventLogPath ?? GUEST_EVENT_LOG_PATH,
          log,
        }),
      initdataBody: initdata.document.toString('utf8'),
      log,
      now: o.now ?? Date.now,
      ...(o.retry === undefined ? {} : { retry: o.retry }),
      ...(o.sleep === undefined ? {} : { sleep: o.sleep }),
      ...(o.keyKind === undefined ? {} : { keyKind: o.keyKind }),
    });
  }
  const broker = config?.kind === 'broker' ? config.broker.url : null;

  const offError = (name: string): KataError => {
    if (error !== null) return error;
    const why = config?.kind === 'no-broker' ? 'its initdata names no broker' : 'it has no initdata';
    return precondition('ATTEST_OFF', `resource ${name}: attestation is off in this pod (${why})`, { details: { resource: name } });
  };

  return {
    start() {
      if (client === null) {
        log.info({ initdata: config?.kind ?? 'invalid' }, 'attestation off');
        return;
      }
      log.info({ broker }, 'attesting at pod start');
      client.attest().catch((err: unknown) => {
        log.warn(
          { broker, err: err instanceof Error ? err.message : String(err) },
          'attestation at start failed; a resource request attests again',
        );
      });
    },
    nudge() {
      client?.nudge();
    },
    status() {
      if (client === null)
        return { state: 'off', broker: null, lastError: error === null ? null : { reason: error.reason, message: error.message } };
      return { broker, ...client.status() };
    },
    async resource(name) {
      if (client === null) {
        // The name is checked all the same, so a bad one is reported as such in any pod.
        parseResourceName(name);
        throw offError(name);
      }
      return client.resource(name);
    },
  };
}
