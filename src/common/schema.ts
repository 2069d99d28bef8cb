import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';

// ajv-formats is CommonJS; under NodeNext its default export arrives wrapped once more.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as unknown as (ajv: Ajv) => Ajv;

let shared: Ajv | undefined;

/** One ajv instance for the process: every document schema is compiled once against it. */
export function schemaCompiler(): Ajv {
  if (shared === undefined) {
    shared = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true });
    addFormats(shared);
  }
  return shared;
}

/** Compile a schema once, lazily, and hand back the same validator on every call. */
export function compileOnce<T>(schema: object): () => ValidateFunction<T> {
  let compiled: ValidateFunction<T> | undefined;
  return () => (compiled ??= schemaCompiler().compile<T>(schema));
}

/**
 * Turn ajv errors into sentences that start with the JSON pointer of the offending key, e.g.
 * `/handlers/kata-ts/vm/maxVcpus must be <= 288` or `/hypervisor/qemuBin is not a known key`.
 */
export function describeSchemaErrors(errors: ErrorObject[] | null | undefined): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const e of errors ?? []) {
    let line: string;
    if (e.keyword === 'additionalProperties') {
      const key = String((e.params as { additionalProperty: string }).additionalProperty);
      line = `${e.instancePath}/${key} is not a known key`;
    } else if (e.keyword === 'enum') {
      const allowed = (e.params as { allowedValues: unknown[] }).allowedValues.map((v) => JSON.stringify(v));
      line = `${e.instancePath || '/'} must be one of ${allowed.join(', ')}`;
    } else {
      line = `${e.instancePath || '/'} ${e.message ?? 'is invalid'}`;
    }
    if (!seen.has(line)) {
      seen.add(line);
      out.push(line);
    }
  }
  return out;
}
