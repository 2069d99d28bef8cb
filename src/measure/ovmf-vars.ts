/**
 * Facts about an OVMF variable-store file (OVMF_VARS*.fd) that PCR 7 depends on: which of the
 * Secure Boot policy variables (PK, KEK, db, dbx, dbt) it holds.
 *
 * The file is a firmware volume (header with "_FVH" at 0x28, its length at 0x30) holding an
 * authenticated variable store: a 28-byte store header, then variables aligned to 4 bytes, each a
 * 60-byte header (StartId 0x55aa, State, Attributes, MonotonicCount, TimeStamp, PubKeyIndex,
 * NameSize, DataSize, VendorGuid), the UTF-16 name and the data. A variable is live while its
 * State is VAR_ADDED (0x3f) or VAR_ADDED in deletion transition (0x3e); older copies read 0x3c/0x3d.
 */
import { invalid } from '../common/errors.js';
import './reasons.js';

/** EFI_GLOBAL_VARIABLE (SecureBoot, PK, KEK). */
export const EFI_GLOBAL_VARIABLE_GUID = '8be4df61-93ca-11d2-aa0d-00e098032b8c';
/** EFI_IMAGE_SECURITY_DATABASE_GUID (db, dbx, dbt). */
export const EFI_IMAGE_SECURITY_DATABASE_GUID = 'd719b2cb-3d3a-4596-a3bc-dad00e67656f';

/** gEfiAuthenticatedVariableGuid: the store signature of OVMF's variable store. */
const AUTHENTICATED_VARIABLE_STORE_GUID = 'aaf32c78-947b-439a-a180-2e144ec37792';
const VARIABLE_HEADER_BYTES = 60;
const STORE_HEADER_BYTES = 28;
const LIVE_STATES = new Set([0x3f, 0x3e]);

export interface OvmfVariable {
  guid: string;
  name: string;
  data: Buffer;
}

function bad(what: string): never {
  throw invalid('MEASURE_VARS_MALFORMED', `the OVMF variable store is not one kata-ts can read: ${what}`);
}

/** An EFI_GUID's 16 bytes (three little-endian fields, then eight bytes) as the usual text form. */
export function guidText(bytes: Buffer): string {
  const h = bytes.toString('hex');
  const le = (s: string): string => s.match(/../g)?.reverse().join('') ?? '';
  return `${le(h.slice(0, 8))}-${le(h.slice(8, 12))}-${le(h.slice(12, 16))}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** The inverse of guidText. */
export function guidBytes(text: string): Buffer {
  const h = text.replace(/-/g, '');
  const le = (s: string): string => s.match(/../g)?.reverse().join('') ?? '';
  return Buffer.from(le(h.slice(0, 8)) + le(h.slice(8, 12)) + le(h.slice(12, 16)) + h.slice(16), 'hex');
}

/** The live variables of an OVMF variable-store file (pure, bounded by the file's own length). */
export function readOvmfVariables(vars: Buffer): OvmfVariable[] {
  if (vars.length < 0x48 || vars.subarray(0x28, 0x2c).toString('latin1') !== '_FVH') bad('no firmware volume header');
  const store = vars.readUInt16LE(0x30);
  if (store + STORE_HEADER_BYTES > vars.length) bad('the variable store header lies outside the file');
  // Only the authenticated layout (60-byte variable headers) is read; OVMF has used nothing else for years.
  if (guidText(vars.subarray(store, store + 16)) !== AUTHENTICATED_VARIABLE_STORE_GUID)
    bad('the variable store is not an authenticated one');
  const storeSize = vars.readUInt32LE(store + 16);
  const end = Math.min(vars.length, store + storeSize);
  const out: OvmfVariable[] = [];
  let at = store + STORE_HEADER_BYTES;
  while (at + VARIABLE_HEADER_BYTES <= end && vars.readUInt16LE(at) === 0x55aa) {
    const state = vars[at + 2] ?? 0;
    const nameSize = vars.readUInt32LE(at + 36);
    const dataSize = vars.readUInt32LE(at + 40);
    const guid = guidText(vars.subarray(at + 44, at + 60));
    const nameAt = at + VARIABLE_HEADER_BYTES;
    if (nameAt + nameSize + dataSize > end) bad(`the variable at offset ${at} runs past the store`);
    if (LIVE_STATES.has(state)) {
      const name = vars
        .subarray(nameAt, nameAt + nameSize)
        .toString('utf16le')
        .replace(/\0+$/, '');
      out.push({ guid, name, data: Buffer.from(vars.subarray(nameAt + nameSize, nameAt + nameSize + dataSize)) });
    }
    at = (nameAt + nameSize + dataSize + 3) & ~3;
  }
  return out;
}

/** The Secure Boot policy variables present in the store (their names), empty when none is enrolled. */
export function secureBootPolicyVariables(vars: Buffer): string[] {
  const policy = new Set([
    `${EFI_GLOBAL_VARIABLE_GUID}/PK`,
    `${EFI_GLOBAL_VARIABLE_GUID}/KEK`,
    `${EFI_IMAGE_SECURITY_DATABASE_GUID}/db`,
    `${EFI_IMAGE_SECURITY_DATABASE_GUID}/dbx`,
    `${EFI_IMAGE_SECURITY_DATABASE_GUID}/dbt`,
  ]);
  return readOvmfVariables(vars)
    .filter((v) => policy.has(`${v.guid}/${v.name}`))
    .map((v) => v.name);
}
