import { readFile } from 'node:fs/promises';
import { errnoCode, invalid, notFound } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { DEFAULT_CONFIG_PATH, DEFAULT_HANDLER, defaultConfig, defaultHandlerProfile } from './defaults.js';
import { configFileSchema } from './schema.js';
import type { HandlerProfile, KataConfig, LoadedConfig } from './types.js';
import { crossFieldProblems } from './validate.js';

const validateFile = compileOnce<Record<string, unknown>>(configFileSchema);

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Overlay `patch` on `base`: objects merge key by key, everything else (arrays too) replaces. */
function overlay<T>(base: T, patch: unknown): T {
  if (!isPlainObject(base) || !isPlainObject(patch)) return (patch === undefined ? base : patch) as T;
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(patch)) out[k] = overlay(out[k], v);
  return out as T;
}

/**
 * Build a full config from a parsed config document (already schema-valid). Each handler named in
 * the document overlays the built-in profile of the same name, or the `kata-ts` profile for a new
 * name, so a handler entry only states what differs.
 */
export function resolveConfig(doc: Record<string, unknown>): KataConfig {
  const base = defaultConfig();
  const { handlers: handlerDoc, ...rest } = doc;
  const config = overlay(base, rest);
  const handlers: Record<string, HandlerProfile> = { ...base.handlers };
  if (isPlainObject(handlerDoc)) {
    for (const [name, patch] of Object.entries(handlerDoc)) {
      const start = base.handlers[name] ?? base.handlers[DEFAULT_HANDLER] ?? defaultHandlerProfile();
      handlers[name] = overlay(start, patch);
    }
  }
  config.handlers = handlers;
  return config;
}

/**
 * Validate a config document and resolve it against the defaults. Throws one INVALID error whose
 * message lists every problem, each starting with the JSON pointer of the key concerned.
 */
export function parseConfigDocument(doc: unknown, source: string): KataConfig {
  const validate = validateFile();
  if (!validate(doc)) {
    const problems = describeSchemaErrors(validate.errors);
    throw invalid('CONFIG_INVALID', `config ${source} is invalid: ${problems.join('; ')}`, { details: { problems } });
  }
  const config = resolveConfig(doc);
  const problems = crossFieldProblems(config);
  if (problems.length > 0) {
    throw invalid('CONFIG_INVALID', `config ${source} is invalid: ${problems.join('; ')}`, { details: { problems } });
  }
  return config;
}

/**
 * Load the config: the given file (which must exist), else the default path when it exists, else
 * the built-in defaults alone.
 */
export async function loadConfig(explicitPath?: string): Promise<LoadedConfig> {
  const file = explicitPath ?? DEFAULT_CONFIG_PATH;
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT' && explicitPath === undefined) return { config: defaultConfig(), path: null };
    if (errnoCode(err) === 'ENOENT') throw notFound('CONFIG_NOT_FOUND', `config file ${file} does not exist`);
    throw invalid('CONFIG_UNREADABLE', `config file ${file} cannot be read`, { cause: err });
  }
  let doc: Json;
  try {
    doc = JSON.parse(text) as Json;
  } catch (err) {
    throw invalid('CONFIG_INVALID', `config ${file} is not valid JSON: ${(err as Error).message}`);
  }
  return { config: parseConfigDocument(doc, file), path: file };
}
