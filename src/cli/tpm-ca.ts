/**
 * `kata-ts tpm-ca init|rotate|show`: the node's CA for its pods' swtpm EK certificates
 * (src/tpm/ca.ts). setup.sh runs `init`; an operator runs `rotate`; a verifier loads what `show`
 * prints.
 */
import { X509Certificate } from 'node:crypto';
import path from 'node:path';
import { isKataError } from '../common/errors.js';
import { loadConfig } from '../config/load.js';
import { initTpmCa, readTpmCa, rotateTpmCa, type TpmCa, type TpmCaGeneration } from '../tpm/ca.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';

const HELP = `Usage: kata-ts tpm-ca <command> [--dir DIR] [--config FILE]

The node's certificate authority for the EK certificates of its pods' software TPMs (vtpm pods).

  init      create the CA (generation 1) when there is none; an existing CA is kept
  rotate    a new CA signs the EK certificates of pods started from now on; the CA that was
            current stays in the bundle for the pods still running, and the one before it is
            dropped (pods older than two rotations no longer verify)
  show      print the CA certificates a verifier loads (current first, then previous), PEM;
            --json for their generation, subject, fingerprint and validity

The dir is --dir, else hypervisor.tpm.caDir of the config file (--config, else KATA_TS_CONFIG,
else /etc/kata-ts/config.json), else /var/lib/kata-ts/tpm-ca.
`;

const OPTIONS = {
  dir: { type: 'string' },
  config: { type: 'string' },
  json: { type: 'boolean' },
} as const;

async function caDirOf(values: { dir?: string | undefined; config?: string | undefined }): Promise<string> {
  if (values.dir !== undefined) {
    if (!path.isAbsolute(values.dir)) throw new UsageError(`--dir must be an absolute path, got "${values.dir}"`);
    return path.normalize(values.dir);
  }
  const file = values.config ?? (process.env.KATA_TS_CONFIG === '' ? undefined : process.env.KATA_TS_CONFIG);
  return (await loadConfig(file)).config.hypervisor.tpm.caDir;
}

function describeGeneration(g: TpmCaGeneration): Record<string, unknown> {
  const cert = new X509Certificate(g.certPem);
  return {
    generation: g.generation,
    subject: cert.subject.split('\n').join(', '),
    fingerprintSha256: cert.fingerprint256,
    validFrom: cert.validFrom,
    validTo: cert.validTo,
  };
}

function describe(ca: TpmCa): Record<string, unknown> {
  return {
    dir: ca.root,
    current: describeGeneration(ca.current),
    previous: ca.previous === null ? null : describeGeneration(ca.previous),
  };
}

/** Entry of `kata-ts tpm-ca`. */
export async function runTpmCaCommand(argv: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || rest.includes('--help') || rest.includes('-h')) {
    io.stdout.write(HELP);
    return name === undefined ? 2 : 0;
  }
  if (name !== 'init' && name !== 'rotate' && name !== 'show') {
    throw new UsageError(`unknown tpm-ca command "${name}"; commands: init, rotate, show`);
  }
  const { values } = parseCommandArgs(rest, OPTIONS);
  try {
    const dir = await caDirOf(values);
    if (name === 'init') {
      const { created, ca } = await initTpmCa(dir);
      io.stdout.write(
        values.json === true
          ? `${JSON.stringify({ created, ...describe(ca) }, null, 2)}\n`
          : `${created ? 'created' : 'kept'} the node's TPM EK CA in ${dir} (generation ${ca.current.generation})\n`,
      );
    } else if (name === 'rotate') {
      const { ca, dropped } = await rotateTpmCa(dir);
      io.stdout.write(
        values.json === true
          ? `${JSON.stringify({ dropped, ...describe(ca) }, null, 2)}\n`
          : `generation ${ca.current.generation} signs new pods' EK certificates; generation ${ca.previous?.generation} stays in the bundle` +
              `${dropped === null ? '' : `; generation ${dropped} was dropped (pods it signed no longer verify)`}\n`,
      );
    } else {
      const ca = await readTpmCa(dir);
      io.stdout.write(values.json === true ? `${JSON.stringify(describe(ca), null, 2)}\n` : ca.bundlePem);
    }
    return 0;
  } catch (err) {
    // A coded error prints its reason, so scripts can match on it.
    if (isKataError(err)) {
      io.stderr.write(`kata-ts tpm-ca ${name}: ${err.reason}: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}
