/**
 * Which broker a pod attests to, read from the pod's initdata the way Confidential Containers'
 * guest components read it: the `[data]` table carries their own config files as text,
 * "aa.toml" (the attestation agent: `[token_configs.kbs] url`, `cert`) and "cdh.toml" (the
 * confidential data hub: `[kbc] url`, `kbs_cert`). The document is the one the agent measured
 * into PCR 8 and published (guest/agent/tpm-initdata.ts), so the broker a guest talks to is part
 * of what it attests: a host that changes the broker address changes PCR 8.
 *
 * The broker is reached over https only, trusting exactly the certificate(s) the initdata gives:
 * a broker address without its certificate is refused, because the system's CAs would let anyone
 * holding a public certificate for that name answer with resources' policies of their own.
 */
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { parse as parseToml } from 'smol-toml';
import { errnoCode, invalid } from '../../../src/common/errors.js';
import { type Initdata, parseInitdataDocument } from '../../../src/measure/initdata.js';
import { GUEST_INITDATA_PATH } from '../tpm-initdata.js';
import './reasons.js';

/** The `[data]` keys read, in the order they are looked at. */
export const AA_TOML_KEY = 'aa.toml';
export const CDH_TOML_KEY = 'cdh.toml';
/** Longest broker URL accepted. */
export const BROKER_URL_MAX_CHARS = 2048;
/** Longest certificate text (a chain of a few PEM certificates). */
export const BROKER_CERT_MAX_CHARS = 64 * 1024;

/** The broker a pod's initdata names. */
export interface BrokerConfig {
  /** The broker's base URL (https), without a trailing slash; endpoints are `<url>/kbs/v0/...`. */
  url: string;
  /** The PEM certificate(s) the broker's TLS certificate must chain to: the only trust anchors. */
  caPem: string;
  /** Which initdata key named it (`data."aa.toml".token_configs.kbs`), for messages and status. */
  source: string;
}

/** What the initdata says: no document, a document naming no broker, or the broker. */
export type AttestConfig =
  | { kind: 'no-initdata' }
  | { kind: 'no-broker'; initdata: Initdata }
  | { kind: 'broker'; broker: BrokerConfig; initdata: Initdata };

function refuse(field: string, what: string, cause?: unknown): never {
  throw invalid('ATTEST_CONFIG_INVALID', `initdata ${field} ${what}`, {
    details: { field },
    ...(cause === undefined ? {} : { cause }),
  });
}

/** A TOML file carried as a `[data]` value, parsed; refused naming the key. */
function parseEmbedded(key: string, text: string): Record<string, unknown> {
  try {
    return parseToml(text) as Record<string, unknown>;
  } catch (err) {
    return refuse(`data."${key}"`, `is not TOML: ${(err as Error).message.split('\n')[0]}`, err);
  }
}

function table(doc: Record<string, unknown>, name: string, field: string): Record<string, unknown> | undefined {
  const v = doc[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'object' || v === null || Array.isArray(v) || v instanceof Date) refuse(field, 'is not a table');
  return v as Record<string, unknown>;
}

/** Checks a broker URL: https, a host, no credentials, query or fragment. Returns it without a trailing slash. */
export function checkBrokerUrl(value: unknown, field: string): string {
  if (typeof value !== 'string') refuse(field, 'is not a string');
  if (value.length > BROKER_URL_MAX_CHARS) refuse(field, `is ${value.length} characters, over ${BROKER_URL_MAX_CHARS}`);
  let url: URL;
  try {
    url = new URL(value);
  } catch (err) {
    return refuse(field, `${JSON.stringify(value)} is not a URL`, err);
  }
  if (url.protocol !== 'https:') refuse(field, `${JSON.stringify(value)} must be an https URL (the broker is reached over TLS only)`);
  if (url.hostname === '') refuse(field, `${JSON.stringify(value)} names no host`);
  if (url.username !== '' || url.password !== '') refuse(field, `${JSON.stringify(value)} must not carry credentials`);
  if (url.search !== '' || url.hash !== '') refuse(field, `${JSON.stringify(value)} must not carry a query or fragment`);
  return url.href.replace(/\/+$/, '');
}

/** Checks the broker's CA text: one or more PEM certificates, each parseable. Returns the text. */
export function checkBrokerCert(value: unknown, field: string): string {
  if (typeof value !== 'string') refuse(field, 'is not a string');
  if (value.length > BROKER_CERT_MAX_CHARS) refuse(field, `is ${value.length} characters, over ${BROKER_CERT_MAX_CHARS}`);
  const blocks = value.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
  if (blocks.length === 0) refuse(field, 'holds no PEM certificate (-----BEGIN CERTIFICATE-----)');
  blocks.forEach((pem, i) => {
    try {
      new X509Certificate(pem);
    } catch (err) {
      refuse(field, `certificate ${i + 1} of ${blocks.length} does not parse: ${(err as Error).message}`, err);
    }
  });
  return `${blocks.join('\n')}\n`;
}

/** The broker named by "aa.toml" (`[token_configs.kbs]`), or undefined. */
function fromAaToml(text: string): BrokerConfig | undefined {
  const base = `data."${AA_TOML_KEY}"`;
  const doc = parseEmbedded(AA_TOML_KEY, text);
  const tokenConfigs = table(doc, 'token_configs', `${base}.token_configs`);
  const kbs = tokenConfigs === undefined ? undefined : table(tokenConfigs, 'kbs', `${base}.token_configs.kbs`);
  if (kbs === undefined) return undefined;
  const field = `${base}.token_configs.kbs`;
  if (kbs.url === undefined) refuse(`${field}.url`, 'is missing');
  const url = checkBrokerUrl(kbs.url, `${field}.url`);
  if (kbs.cert === undefined) refuse(`${field}.cert`, 'is missing: an https broker is trusted only through the certificate initdata gives');
  return { url, caPem: checkBrokerCert(kbs.cert, `${field}.cert`), source: field };
}

/** The broker named by "cdh.toml" (`[kbc]`), or undefined. */
function fromCdhToml(text: string): BrokerConfig | undefined {
  const base = `data."${CDH_TOML_KEY}"`;
  const doc = parseEmbedded(CDH_TOML_KEY, text);
  const kbc = table(doc, 'kbc', `${base}.kbc`);
  if (kbc === undefined || kbc.url === undefined) return undefined;
  const field = `${base}.kbc`;
  const url = checkBrokerUrl(kbc.url, `${field}.url`);
  if (kbc.kbs_cert === undefined)
    refuse(`${field}.kbs_cert`, 'is missing: an https broker is trusted only through the certificate initdata gives');
  return { url, caPem: checkBrokerCert(kbc.kbs_cert, `${field}.kbs_cert`), source: field };
}

/**
 * The broker an initdata document names (pure). "aa.toml" wins where both name one, but they
 * must then agree: two brokers in one document would leave which one vouches for the pod to chance.
 * Throws ATTEST_CONFIG_INVALID naming the key.
 */
export function brokerFromInitdata(initdata: Initdata): BrokerConfig | undefined {
  const aaText = initdata.data[AA_TOML_KEY];
  const cdhText = initdata.data[CDH_TOML_KEY];
  const aa = aaText === undefined ? undefined : fromAaToml(aaText);
  const cdh = cdhText === undefined ? undefined : fromCdhToml(cdhText);
  if (aa !== undefined && cdh !== undefined) {
    if (aa.url !== cdh.url) refuse(`${cdh.source}.url`, `names ${cdh.url} but ${aa.source}.url names ${aa.url}; name one broker`);
    if (aa.caPem !== cdh.caPem) refuse(`${cdh.source}.kbs_cert`, `differs from ${aa.source}.cert; name one broker`);
  }
  return aa ?? cdh;
}

/** The attest configuration of a document's bytes (pure); throws ATTEST_CONFIG_INVALID. */
export function attestConfigFromDocument(document: Buffer): AttestConfig {
  let initdata: Initdata;
  try {
    initdata = parseInitdataDocument(document);
  } catch (err) {
    return refuse('document', `does not parse: ${(err as Error).message}`, err);
  }
  const broker = brokerFromInitdata(initdata);
  return broker === undefined ? { kind: 'no-broker', initdata } : { kind: 'broker', broker, initdata };
}

/**
 * Reads the published initdata (`initdataPath`, /run/kata-ts/initdata.toml by default) and the
 * broker it names. A missing file means no initdata (or one withheld as unmeasured): attestation
 * is off. Throws ATTEST_CONFIG_INVALID naming the key.
 */
export async function readAttestConfig(initdataPath = GUEST_INITDATA_PATH): Promise<AttestConfig> {
  let document: Buffer;
  try {
    document = await readFile(initdataPath);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return { kind: 'no-initdata' };
    throw err;
  }
  return attestConfigFromDocument(document);
}
