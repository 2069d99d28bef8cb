import { notFound } from '../common/errors.js';
import type { HandlerProfile, KataConfig } from './types.js';

export interface ResolvedHandler {
  /** The configured name (never ""): what records and plans store. */
  name: string;
  profile: HandlerProfile;
}

/**
 * Look up the handler a RuntimeClass selects. "" (the kubelet's choice when a pod names no
 * RuntimeClass) means the default handler. An unknown name is NOT_FOUND and names the known ones.
 */
export function resolveHandler(config: KataConfig, requested: string): ResolvedHandler {
  const name = requested === '' ? config.defaultHandler : requested;
  const profile = config.handlers[name];
  if (profile === undefined) {
    const known = Object.keys(config.handlers).sort();
    throw notFound('HANDLER_UNKNOWN', `runtime_handler "${requested}" is not configured; known handlers: ${known.join(', ')}`, {
      details: { requested, known },
    });
  }
  return { name, profile };
}
