import type { CreateDeps, CreatedSandbox, CreateRequest } from './create-types.js';
import { executeSandbox } from './execute.js';
import { prepareSandbox } from './prepare.js';

/**
 * RunPodSandbox: validate, gather facts and plan with no side effect (prepareSandbox), then carry
 * the plan out (executeSandbox), where every effect registers its undo as it is made and a failure
 * rolls them all back before the error is rethrown.
 */
export async function createSandbox(deps: CreateDeps, req: CreateRequest): Promise<CreatedSandbox> {
  const prep = await prepareSandbox(deps, req);
  const claimed = deps.pool === undefined ? null : await deps.pool.claim(deps, prep);
  return claimed ?? executeSandbox(deps, prep);
}
