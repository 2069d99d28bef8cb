/**
 * `kata-ts broker init|serve|resource|reference|policy|log`: the attestation broker
 * (src/broker), a process of its own with its own state directory. See docs/attestation.md,
 * "The broker".
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { DecisionLog } from '../broker/decisions.js';
import { referenceTee } from '../broker/references.js';
import { DEFAULT_BROKER_LISTEN, parseListen, startBroker } from '../broker/server.js';
import { brokerPaths, checkBrokerDir, DEFAULT_BROKER_DIR, initBrokerState, parseSans, validateBrokerDir } from '../broker/state.js';
import {
  addReference,
  CONFIG_FILE_MAX_BYTES,
  deleteReference,
  deleteResource,
  listReferenceNames,
  listResources,
  RESOURCE_MAX_BYTES,
  readPolicy,
  readReference,
  setPolicy,
  setResource,
} from '../broker/store.js';
import { errorMessage, invalid, isKataError } from '../common/errors.js';
import { DEFAULT_TPM_CA_DIR } from '../tpm/ca.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const HELP = `Usage: kata-ts broker <command> [--dir DIR] ...

The attestation broker: trustee's KBS protocol over HTTPS; resources released, encrypted to a
key that exists only in the guest, to pods whose evidence matches a reference set the policy allows.

  init [--san DNS:name,IP:addr ...] [--json]
                     create the state dir (TLS key and self-signed certificate for the SANs,
                     token signing key, empty policy); an existing one is kept. Prints the
                     certificate's path: its PEM is what a pod's initdata carries
  serve [--listen HOST:PORT] [--tpm-ca-bundle FILE] [--tpm-ca-dir DIR]
        [--snp-amd-certs FILE] [--tdx-intel-root-ca FILE]
        [--session-ttl-seconds N] [--nonce-ttl-seconds N] [--max-sessions N]
                     serve /kbs/v0/auth, /kbs/v0/attest, /kbs/v0/resource/... (default ${DEFAULT_BROKER_LISTEN});
                     admin changes are picked up without restart. tpm evidence is verified
                     against the EK CA bundle (--tpm-ca-bundle, else DIR/tpm-ca-bundle.pem, else
                     the node's tpm-ca dir, /var/lib/kata-ts/tpm-ca); snp and tdx only with
                     their vendor roots
  resource set <repository/type/tag> (--file FILE | --stdin)
  resource list [--json]          paths and sizes (never contents)
  resource delete <repository/type/tag>
  reference add <name> --file FILE   a kata-ts/reference-values/v1 document (kata-ts plan
                                     --measurements --format json, or a sandbox's verbose
                                     status info with its referenceValues)
  reference list [--json]
  reference delete <name>
  policy set --file FILE          kata-ts/broker-policy/v1
  policy show
  log [--follow]                  the decision log (JSON lines)

DIR defaults to ${DEFAULT_BROKER_DIR}.
`;

const OPTIONS = {
  dir: { type: 'string' },
  san: { type: 'string', multiple: true },
  json: { type: 'boolean' },
  listen: { type: 'string' },
  'tpm-ca-bundle': { type: 'string' },
  'tpm-ca-dir': { type: 'string' },
  'snp-amd-certs': { type: 'string' },
  'tdx-intel-root-ca': { type: 'string' },
  'session-ttl-seconds': { type: 'string' },
  'nonce-ttl-seconds': { type: 'string' },
  'max-sessions': { type: 'string' },
  file: { type: 'string' },
  stdin: { type: 'boolean' },
  follow: { type: 'boolean' },
} as const;

type Values = ReturnType<typeof parseCommandArgs<typeof OPTIONS>>['values'];

/** Which options each command takes; anything else is a usage error. */
const ALLOWED: Record<string, readonly (keyof typeof OPTIONS)[]> = {
  init: ['dir', 'san', 'json'],
  serve: [
    'dir',
    'listen',
    'tpm-ca-bundle',
    'tpm-ca-dir',
    'snp-amd-certs',
    'tdx-intel-root-ca',
    'session-ttl-seconds',
    'nonce-ttl-seconds',
    'max-sessions',
  ],
  'resource set': ['dir', 'file', 'stdin'],
  'resource list': ['dir', 'json'],
  'resource delete': ['dir'],
  'reference add': ['dir', 'file'],
  'reference list': ['dir', 'json'],
  'reference delete': ['dir'],
  'policy set': ['dir', 'file'],
  'policy show': ['dir'],
  log: ['dir', 'follow'],
};
/** Positional arguments each command takes. */
const POSITIONALS: Record<string, number> = { 'resource set': 1, 'resource delete': 1, 'reference add': 1, 'reference delete': 1 };

function dirOf(values: Values): string {
  const dir = values.dir ?? DEFAULT_BROKER_DIR;
  if (!path.isAbsolute(dir)) throw new UsageError(`--dir must be an absolute path, got "${dir}"`);
  return validateBrokerDir(path.normalize(dir).replace(/\/+$/, '') || '/');
}

function positiveInt(values: Values, name: 'session-ttl-seconds' | 'nonce-ttl-seconds' | 'max-sessions', max: number): number | undefined {
  const text = values[name];
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(n) || n < 1 || n > max)
    throw invalid('BROKER_CONFIG_INVALID', `--${name} must be an integer from 1 to ${max}, got ${JSON.stringify(text)}`, {
      details: { field: name },
    });
  return n;
}

async function readInputFile(file: string, maxBytes: number, option: string): Promise<Buffer> {
  let st: Awaited<ReturnType<typeof fsp.stat>>;
  try {
    st = await fsp.stat(file);
  } catch (err) {
    throw invalid('BROKER_CONFIG_INVALID', `--${option} ${file} cannot be read: ${errorMessage(err)}`, {
      cause: err,
      details: { field: option },
    });
  }
  if (!st.isFile()) throw invalid('BROKER_CONFIG_INVALID', `--${option} ${file} is not a regular file`, { details: { field: option } });
  if (st.size > maxBytes)
    throw invalid('BROKER_CONFIG_INVALID', `--${option} ${file} is ${st.size} bytes, over ${maxBytes}`, { details: { field: option } });
  return fsp.readFile(file);
}

async function readStdin(maxBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of process.stdin as AsyncIterable<Buffer>) {
    total += chunk.byteLength;
    if (total > maxBytes) throw invalid('BROKER_RESOURCE_INVALID', `stdin is over ${maxBytes} bytes`, { details: { field: 'stdin' } });
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function parseJsonInput(buf: Buffer, file: string, reason: 'BROKER_REFERENCE_INVALID' | 'BROKER_POLICY_INVALID'): unknown {
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch (err) {
    throw invalid(reason, `--file ${file} is not JSON: ${errorMessage(err)}`, { cause: err, details: { field: 'file' } });
  }
}

function needFile(values: Values): string {
  if (values.file === undefined) throw new UsageError('--file FILE is required');
  return values.file;
}

async function serve(values: Values, io: CliIo): Promise<number> {
  const root = dirOf(values);
  await checkBrokerDir(root);
  const paths = brokerPaths(root);
  const listen = parseListen(values.listen ?? DEFAULT_BROKER_LISTEN);
  const sessionTtl = positiveInt(values, 'session-ttl-seconds', 86_400);
  const nonceTtl = positiveInt(values, 'nonce-ttl-seconds', 3_600);
  const maxSessions = positiveInt(values, 'max-sessions', 1_000_000);
  const bundleFile = values['tpm-ca-bundle'];
  const tpmCaBundlePem =
    bundleFile === undefined ? undefined : (await readInputFile(bundleFile, 1024 * 1024, 'tpm-ca-bundle')).toString('utf8');
  const amdFile = values['snp-amd-certs'];
  const snpAmdCertsPem = amdFile === undefined ? null : (await readInputFile(amdFile, 1024 * 1024, 'snp-amd-certs')).toString('utf8');
  const intelFile = values['tdx-intel-root-ca'];
  const tdxIntelRootCaPem =
    intelFile === undefined ? null : (await readInputFile(intelFile, 1024 * 1024, 'tdx-intel-root-ca')).toString('utf8');
  const log = new DecisionLog(paths.decisionsLog, io.stderr);
  let running: Awaited<ReturnType<typeof startBroker>>;
  try {
    running = await startBroker({
      paths,
      listen,
      log,
      limits: {
        ...(sessionTtl === undefined ? {} : { sessionTtlMs: sessionTtl * 1000 }),
        ...(nonceTtl === undefined ? {} : { nonceTtlMs: nonceTtl * 1000 }),
        ...(maxSessions === undefined ? {} : { maxSessions }),
      },
      ...(tpmCaBundlePem === undefined ? {} : { tpmCaBundlePem }),
      snpAmdCertsPem,
      tdxIntelRootCaPem,
      tpmCaDir: values['tpm-ca-dir'] ?? DEFAULT_TPM_CA_DIR,
    });
  } catch (err) {
    log.close();
    throw err;
  }
  const host = running.address.host.includes(':') ? `[${running.address.host}]` : running.address.host;
  io.stdout.write(`listening on https://${host}:${running.address.port} (tees: ${[...running.verifiers.keys()].join(', ') || 'none'})\n`);
  await new Promise<void>((resolve) => {
    const stop = () => {
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      resolve();
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
  await running.close();
  log.record({ event: 'serve', outcome: 'stopped' });
  log.close();
  return 0;
}

async function showLog(values: Values, io: CliIo): Promise<number> {
  const root = dirOf(values);
  await checkBrokerDir(root);
  const file = brokerPaths(root).decisionsLog;
  let offset = 0;
  const pump = async () => {
    const handle = await fsp.open(file, 'r').catch(() => undefined);
    if (handle === undefined) return;
    try {
      const { size } = await handle.stat();
      if (size < offset) offset = 0; // replaced or truncated: start over
      while (offset < size) {
        const buf = Buffer.alloc(Math.min(size - offset, 1024 * 1024));
        const { bytesRead } = await handle.read(buf, 0, buf.length, offset);
        if (bytesRead === 0) break;
        offset += bytesRead;
        io.stdout.write(buf.subarray(0, bytesRead));
      }
    } finally {
      await handle.close();
    }
  };
  await pump();
  if (values.follow !== true) return 0;
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => void pump(), 250);
    const stop = () => {
      clearInterval(timer);
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      resolve();
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
  return 0;
}

async function run(command: string, positionals: string[], values: Values, io: CliIo): Promise<number> {
  if (command === 'init') {
    const sans = parseSans(values.san ?? []);
    const { created, paths } = await initBrokerState(dirOf(values), sans);
    io.stdout.write(
      values.json === true
        ? `${JSON.stringify({ created, dir: paths.root, cert: paths.tlsCert }, null, 2)}\n`
        : `${created ? 'created' : 'kept'} the broker state in ${paths.root}; its certificate (for the pods' initdata): ${paths.tlsCert}\n`,
    );
    return 0;
  }
  if (command === 'serve') return serve(values, io);
  if (command === 'log') return showLog(values, io);

  const root = dirOf(values);
  await checkBrokerDir(root);
  const paths = brokerPaths(root);
  const arg = positionals[0] as string;
  switch (command) {
    case 'resource set': {
      if ((values.file === undefined) === (values.stdin !== true))
        throw new UsageError('resource set takes exactly one of --file FILE or --stdin');
      const data =
        values.file !== undefined ? await readInputFile(values.file, RESOURCE_MAX_BYTES, 'file') : await readStdin(RESOURCE_MAX_BYTES);
      await setResource(paths, arg, data);
      io.stdout.write(`stored resource ${arg} (${data.byteLength} bytes)\n`);
      return 0;
    }
    case 'resource list': {
      const list = await listResources(paths);
      io.stdout.write(
        values.json === true ? `${JSON.stringify(list, null, 2)}\n` : list.map((r) => `${r.path}\t${r.bytes} bytes\n`).join(''),
      );
      return 0;
    }
    case 'resource delete':
      await deleteResource(paths, arg);
      io.stdout.write(`deleted resource ${arg}\n`);
      return 0;
    case 'reference add': {
      const file = needFile(values);
      const doc = await addReference(
        paths,
        arg,
        parseJsonInput(await readInputFile(file, CONFIG_FILE_MAX_BYTES, 'file'), file, 'BROKER_REFERENCE_INVALID'),
        file,
      );
      io.stdout.write(`stored reference set ${arg} (tee ${doc.tee}, pod ${doc.pod.namespace}/${doc.pod.name})\n`);
      return 0;
    }
    case 'reference list': {
      const names = await listReferenceNames(paths);
      const rows = await Promise.all(
        names.map(async (name) => {
          try {
            const doc = await readReference(paths, name);
            return { name, tee: referenceTee(doc), pod: `${doc.pod.namespace}/${doc.pod.name}` };
          } catch (err) {
            return { name, error: errorMessage(err) };
          }
        }),
      );
      io.stdout.write(
        values.json === true
          ? `${JSON.stringify(rows, null, 2)}\n`
          : rows.map((r) => ('error' in r ? `${r.name}\tINVALID: ${r.error}\n` : `${r.name}\t${r.tee}\t${r.pod}\n`)).join(''),
      );
      return 0;
    }
    case 'reference delete':
      await deleteReference(paths, arg);
      io.stdout.write(`deleted reference set ${arg}\n`);
      return 0;
    case 'policy set': {
      const file = needFile(values);
      const policy = await setPolicy(
        paths,
        parseJsonInput(await readInputFile(file, CONFIG_FILE_MAX_BYTES, 'file'), file, 'BROKER_POLICY_INVALID'),
      );
      io.stdout.write(`stored the policy (${policy.resources.length} resources)\n`);
      return 0;
    }
    case 'policy show':
      io.stdout.write(`${JSON.stringify(await readPolicy(paths), null, 2)}\n`);
      return 0;
    default:
      throw new UsageError(`unknown broker command "${command}"`);
  }
}

/** Entry of `kata-ts broker`. */
export async function runBrokerCommand(argv: string[], io: CliIo): Promise<number> {
  const [first, ...rest] = argv;
  if (first === undefined || first === '--help' || first === '-h' || argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(HELP);
    return first === undefined ? 2 : 0;
  }
  let command = first;
  let args = rest;
  if (first === 'resource' || first === 'reference' || first === 'policy') {
    const sub = rest[0];
    command = `${first} ${sub ?? ''}`;
    args = rest.slice(1);
  }
  const allowed = ALLOWED[command];
  if (allowed === undefined)
    throw new UsageError(`unknown broker command "${command.trim()}"; commands: ${Object.keys(ALLOWED).join(', ')}`);
  const { values, positionals } = parseCommandArgs(args, OPTIONS, true);
  for (const key of Object.keys(values))
    if (!allowed.includes(key as keyof typeof OPTIONS)) throw new UsageError(`${command} does not take --${key}`);
  const wanted = POSITIONALS[command] ?? 0;
  if (positionals.length !== wanted)
    throw new UsageError(`${command} takes ${wanted === 0 ? 'no' : wanted} argument${wanted === 1 ? '' : 's'}, got ${positionals.length}`);
  try {
    return await run(command, positionals, values, io);
  } catch (err) {
    if (isKataError(err)) {
      io.stderr.write(`kata-ts broker ${command}: ${err.reason}: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}
