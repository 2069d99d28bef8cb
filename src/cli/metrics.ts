/**
 * `kata-ts metrics --shims`: one node-level scrape of every pod shim's metrics socket (what
 * kata-monitor does for Kata's shims), printed as one exposition: each family once, with every
 * pod's samples. A socket that does not answer (a shim that died, one starting) is skipped and
 * named on stderr, and counted in `kata_ts_node_shim_scrape_failures`; the scrape goes on.
 */
import { loadConfig } from '../config/load.js';
import { formatExposition, type MetricFamily, mergeFamilies, parseExposition } from '../shim/exposition.js';
import { readShimPods, scrapeMetricsSocket } from '../shim/node-pods.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const HELP = `Usage: kata-ts metrics --shims [--config FILE] [--state-root DIR] [--timeout-ms N]

Scrapes every pod shim's metrics socket (<shim.stateRoot>/<namespace>/<pod>/metrics.sock) and
prints their Prometheus text (format 0.0.4) merged into one exposition on stdout. Sockets that do
not answer within --timeout-ms (default 5000) are named on stderr and left out.
`;

/** A pod's scrape: its text, or why there is none. */
export type ShimScrape = { socket: string; text: string } | { socket: string; error: string };

/** The node's exposition from its pods' scrapes (pure): merged families, plus the node's own scrape counts. */
export function nodeExposition(scrapes: readonly ShimScrape[]): { text: string; problems: string[] } {
  const groups: MetricFamily[][] = [];
  const problems: string[] = [];
  for (const s of scrapes) {
    if ('error' in s) {
      problems.push(`${s.socket}: ${s.error}`);
      continue;
    }
    try {
      groups.push(parseExposition(s.text));
    } catch (err) {
      problems.push(`${s.socket}: not a valid exposition: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  let merged: MetricFamily[];
  try {
    merged = mergeFamilies(groups);
  } catch (err) {
    // Two releases disagreeing on a family's type: each pod's text is still worth printing apart.
    problems.push(err instanceof Error ? err.message : String(err));
    merged = mergeFamilies(groups.slice(0, 1));
  }
  merged.push(
    {
      name: 'kata_ts_node_shim_scrapes',
      help: 'Pod shim metrics sockets scraped by this node-level scrape.',
      type: 'gauge',
      samples: [{ suffix: '', labels: {}, value: scrapes.length }],
    },
    {
      name: 'kata_ts_node_shim_scrape_failures',
      help: 'Pod shim metrics sockets that did not answer with a valid exposition.',
      type: 'gauge',
      samples: [{ suffix: '', labels: {}, value: problems.length }],
    },
  );
  return { text: formatExposition(merged), problems };
}

export async function runMetricsCommand(argv: string[], io: CliIo): Promise<number> {
  const { values, positionals } = parseCommandArgs(
    argv,
    {
      shims: { type: 'boolean' },
      config: { type: 'string' },
      'state-root': { type: 'string' },
      'timeout-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    true,
  );
  if (values.help === true) {
    io.stdout.write(HELP);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`metrics takes no arguments, got "${positionals.join(' ')}"`);
  if (values.shims !== true) throw new UsageError('--shims is required (the daemon serves its own metrics on metricsAddress)');
  const stateRootFlag = values['state-root'];
  if (stateRootFlag !== undefined && !stateRootFlag.startsWith('/'))
    throw new UsageError(`--state-root must be an absolute path, got "${stateRootFlag}"`);
  const timeoutText = values['timeout-ms'] ?? '5000';
  const timeoutMs = Number(timeoutText);
  if (!/^\d+$/.test(timeoutText) || timeoutMs < 1)
    throw new UsageError(`--timeout-ms must be a positive whole number, got "${timeoutText}"`);
  const stateRoot = stateRootFlag ?? (await loadConfig(values.config)).config.shim.stateRoot;
  const sockets = (await readShimPods(stateRoot)).flatMap((p) => (p.metricsSocket === undefined ? [] : [p.metricsSocket]));
  const scrapes = await Promise.all(
    sockets.map((socket) =>
      scrapeMetricsSocket(socket, timeoutMs).then(
        (text): ShimScrape => ({ socket, text }),
        (err: unknown): ShimScrape => ({ socket, error: err instanceof Error ? err.message : String(err) }),
      ),
    ),
  );
  const { text, problems } = nodeExposition(scrapes);
  for (const p of problems) io.stderr.write(`kata-ts metrics: skipped ${p}\n`);
  io.stdout.write(text);
  return 0;
}
