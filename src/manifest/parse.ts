import { parseAllDocuments } from 'yaml';
import { invalid } from '../common/errors.js';

/**
 * Parse a YAML or JSON document (JSON is YAML) into plain data. Integers too large for a double
 * come back as bigint, so a quantity such as `memory: 9007199254740993` keeps every digit.
 * Exactly one document is expected. Errors: invalid/MANIFEST_SYNTAX with the line and column.
 */
export function parseYamlDocument(text: string, source: string): unknown {
  const documents = parseAllDocuments(text, { intAsBigInt: true, prettyErrors: true });
  if (!Array.isArray(documents)) {
    // An empty stream parses to an empty-list-like value.
    throw invalid('MANIFEST_SYNTAX', `${source} holds no document`);
  }
  const nonEmpty = documents.filter((d) => d.contents !== null || d.errors.length > 0);
  if (nonEmpty.length === 0) throw invalid('MANIFEST_SYNTAX', `${source} holds no document`);
  if (nonEmpty.length > 1) throw invalid('MANIFEST_SYNTAX', `${source} holds ${nonEmpty.length} documents; plan one pod per file`);
  const doc = nonEmpty[0]!;
  const error = doc.errors[0];
  if (error !== undefined) {
    const where = error.linePos?.[0] !== undefined ? ` at line ${error.linePos[0].line}, column ${error.linePos[0].col}` : '';
    const message = (error.message.split('\n')[0] ?? '').replace(/ at line \d+, column \d+:?$/, '');
    throw invalid('MANIFEST_SYNTAX', `${source} is not valid YAML or JSON${where}: ${message}`);
  }
  return doc.toJS({ maxAliasCount: 100 });
}
