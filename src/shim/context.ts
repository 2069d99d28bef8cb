/** The core's RequestContext for one ttrpc call of the task API. */
import type { Logger } from '../common/logger.js';
import type { RequestContext } from '../runtime/context.js';
import type { TtrpcCall } from '../ttrpc/index.js';

export function requestContext(call: TtrpcCall, logger: Logger): RequestContext {
  const fields: Record<string, unknown> = {};
  return {
    method: call.method,
    logger: logger.child({ rpc: call.method }),
    signal: call.signal,
    deadlineMs: call.timeoutMs === undefined ? undefined : Date.now() + call.timeoutMs,
    annotate: (extra) => Object.assign(fields, extra),
  };
}
