import { matchesLabels } from '../labels.js';
import type { ContainerRecord } from './record.js';
import type { ContainerFilter } from './types.js';

/** Does a container pass a listing's filter (pure)? */
export function containerMatches(r: ContainerRecord, filter: ContainerFilter | null | undefined): boolean {
  if (filter === null || filter === undefined) return true;
  if (filter.idPrefix !== undefined && filter.idPrefix !== '' && !r.id.startsWith(filter.idPrefix)) return false;
  if (filter.sandboxIdPrefix !== undefined && filter.sandboxIdPrefix !== '' && !r.sandboxId.startsWith(filter.sandboxIdPrefix)) {
    return false;
  }
  if (filter.state !== undefined && filter.state !== r.state) return false;
  return matchesLabels(r.labels, filter.labels ?? {});
}
