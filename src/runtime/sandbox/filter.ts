import { matchesLabels } from '../labels.js';
import type { SandboxRecord } from './record.js';
import type { SandboxFilter } from './types.js';

/** Does a sandbox pass a listing's filter (pure)? */
export function sandboxMatches(r: SandboxRecord, filter: SandboxFilter | null | undefined): boolean {
  if (filter === null || filter === undefined) return true;
  if (filter.idPrefix !== undefined && filter.idPrefix !== '' && !r.id.startsWith(filter.idPrefix)) return false;
  if (filter.state !== undefined && filter.state !== r.state) return false;
  return matchesLabels(r.labels, filter.labels ?? {});
}
