import type { CreateDeps, CreatedSandbox, CreateRequest } from './create-types.js';
import { executeSandbox } from './execute.js';
import { prepareSandbox } from './prepare.js';

/**
 * RunPodSandbox: validate, gather facts and plan with no side effect (prepareSandbox), then carry
 * the plan out: as a clone of the handler's template when it has one that fits
 * (docs/templates.md), else from the pool (docs/pool.md), else by a cold boot (executeSandbox),
 * where every effect registers its undo as it is made and a failure rolls them all back before
 * the error is rethrown. Why a pod did not come from a template or the pool is kept in its
 * record's `origin` (the status shows it).
 */
export async function createSandbox(deps: CreateDeps, req: CreateRequest): Promise<CreatedSandbox> {
  const prep = await prepareSandbox(deps, req);
  const answer = deps.templates === undefined ? undefined : await deps.templates.clone(deps, prep);
  if (answer?.kind === 'clone') return answer.created;
  const templateMiss = answer?.miss ?? null;
  const claimed = deps.pool === undefined ? null : await deps.pool.claim(deps, prep);
  if (claimed !== null) {
    if (templateMiss !== null && claimed.record.origin?.kind === 'pool') {
      claimed.record.origin = { ...claimed.record.origin, templateMiss };
      await deps.store.put(claimed.record);
    }
    return claimed;
  }
  if (templateMiss !== null) {
    const origin = prep.record.origin;
    prep.record.origin = { kind: 'cold', poolMiss: origin?.kind === 'cold' ? origin.poolMiss : null, templateMiss };
  }
  return executeSandbox(deps, prep);
}
