import { existsSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import { errnoCode, errorMessage, invalid, isKataError, precondition } from '../common/errors.js';
import { loadConfig } from '../config/load.js';
import { chooseAcceleration, detectHostTee, guestImageVerityPath, parseQemuVersion, readGuestImageVerity } from '../hypervisor/index.js';
import { inventoryOptionsForRoot, readPcieHostFacts } from '../pcie/index.js';
import type { TeeFacts } from '../runtime/facts.js';
import { checkQemu } from '../runtime/gather-facts.js';
import type { HostCapacity } from '../sizing/types.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';
import { loadPlanRequest } from './plan/load.js';
import { measurementsOutput, plannedReferenceValues } from './plan/measurements.js';
import { planJson, planText } from './plan/output.js';
import { defaultOverheadAccel, type OverheadAccel, runtimeClassObject, runtimeClassOverhead, runtimeClassYaml } from './plan/overhead.js';
import { buildPlanReport } from './plan/report.js';

export const PLAN_USAGE = `Usage: kata-ts plan --request FILE [--config FILE] [--handler NAME] [--format text|json]
                    [--host-cpus N] [--host-memory-mib N] [--sysfs-root DIR] [--cdi-dir DIR]...

       kata-ts plan --overhead [--config FILE] [--handler NAME] [--format yaml|json] [--accel kvm|tcg|any]

       kata-ts plan --measurements --request FILE [--config FILE] [--handler NAME] [--format text|json|rvps]

Shows how kata-ts would shape a pod's VM, without starting anything. With --overhead: the
RuntimeClass for a handler (every handler without --handler), its overhead.podFixed computed from
the handler's VMM budget (vmmOverhead, plus QEMU's TCG translation cache unless --accel kvm;
default from hypervisor.acceleration, \`auto\` covering both); format yaml (default) or json.
With --measurements: the launch measurements the pod's VM will have, predicted from the planned
QEMU argv and the files it names (vtpm: PCRs 4, 7, 8, 9 and their events); json is the
reference-values document (kata-ts/reference-values/v1), rvps the message trustee's
\`rvps-tool register\` takes (sample provenance, PCR N named tpm_pcrN).

  --request FILE        a Kubernetes Pod manifest (YAML or JSON; kind: Pod) or a
                        RunPodSandboxRequest in proto3 JSON
  --config FILE         kata-ts config file (default: /etc/kata-ts/config.json if present)
  --handler NAME        runtime handler to plan for (default: the request's runtime_handler,
                        the manifest's runtimeClassName, else the default handler)
  --format text|json    output format (default: text)
  --host-cpus N         plan for a host with N CPUs instead of this one
  --host-memory-mib N   plan for a host with N MiB of memory instead of this one
  --sysfs-root DIR      read PCI devices and IOMMU groups from DIR instead of the config's sysfs
                        root (a fixtures/sysfs/<name> tree carries its own dev/ and device numbers)
  --cdi-dir DIR         read CDI specs from DIR instead of the config's CDI dirs (repeatable,
                        lowest priority first)

Exit status: 0 planned; 1 the pod does not fit (handler ceiling or host); 2 bad usage, an
unreadable or invalid request file or config, or an unknown handler.
`;

const MiB = 1024 * 1024;

const OPTIONS = {
  request: { type: 'string', short: 'r' },
  config: { type: 'string', short: 'c' },
  handler: { type: 'string' },
  format: { type: 'string', short: 'f' },
  'host-cpus': { type: 'string' },
  'host-memory-mib': { type: 'string' },
  'sysfs-root': { type: 'string' },
  'cdi-dir': { type: 'string', multiple: true },
  overhead: { type: 'boolean' },
  measurements: { type: 'boolean' },
  accel: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

function positiveInteger(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  if (!/^[1-9]\d{0,8}$/.test(text)) throw new UsageError(`${flag} must be a positive integer, got "${text}"`);
  return Number(text);
}

/** The host this runs on: read here, in the CLI layer, and handed to the pure planner. */
function hostCapacity(cpus: number | undefined, memoryMiB: number | undefined): HostCapacity {
  return {
    cpus: cpus ?? Math.max(1, os.cpus().length),
    memoryMiB: memoryMiB ?? Math.floor(os.totalmem() / MiB),
  };
}

function oneLine(text: string): string {
  return text.replace(/\s*\n\s*/g, ' ').trim();
}

/**
 * `kata-ts plan`: returns the exit code. Every failure is one line on stderr: exit 2 for usage
 * mistakes and bad input (invalid/not-found errors), 1 for a pod that does not fit or any other
 * failure.
 */
export async function runPlanCommand(argv: string[], io: CliIo): Promise<number> {
  const fail = (code: number, message: string): number => {
    io.stderr.write(`kata-ts plan: ${oneLine(message)}\n`);
    return code;
  };
  let file = '';
  try {
    const { values } = parseCommandArgs(argv, OPTIONS);
    if (values.help === true) {
      io.stdout.write(PLAN_USAGE);
      return 0;
    }
    if (values.overhead === true) return await printOverhead(values, io);
    if (values.request === undefined) throw new UsageError('--request FILE is required (see kata-ts plan --help)');
    const format = values.format ?? 'text';
    const measure = values.measurements === true;
    if (measure && format !== 'text' && format !== 'json' && format !== 'rvps')
      throw new UsageError(`--format must be text, json or rvps with --measurements, got "${format}"`);
    if (!measure && format !== 'text' && format !== 'json') throw new UsageError(`--format must be text or json, got "${format}"`);
    const cpus = positiveInteger(values['host-cpus'], '--host-cpus');
    const memoryMiB = positiveInteger(values['host-memory-mib'], '--host-memory-mib');
    file = values.request;

    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      const code = errnoCode(err);
      return fail(
        2,
        `cannot read ${file}: ${code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'it is a directory' : errorMessage(err)}`,
      );
    }
    const { request } = loadPlanRequest(text, file);
    const { config } = await loadConfig(values.config);
    const sysfsRoot = values['sysfs-root'];
    const pcieConfig = { ...config.pcie, ...(values['cdi-dir'] === undefined ? {} : { cdiSpecDirs: values['cdi-dir'] }) };
    const pcieFacts = await readPcieHostFacts(
      pcieConfig,
      sysfsRoot === undefined ? undefined : await inventoryOptionsForRoot(sysfsRoot, config.pcie.devRoot),
    );
    const env = {
      config,
      host: hostCapacity(cpus, memoryMiB),
      pcieFacts,
      accel: chooseAcceleration(config.hypervisor.acceleration),
      vhostNet: existsSync('/dev/vhost-net'),
      // What a handler's tee.kind resolves to here, and whether this QEMU can start it.
      tee: await teeFacts(config.hypervisor.qemuBinary),
      // The guest image's dm-verity table (a TEE pod's command line carries its root hash).
      guestImageVerity: config.hypervisor.guestImagePath === null ? null : await readGuestImageVerity(config.hypervisor.guestImagePath),
    };
    const report = buildPlanReport(request, env, values.handler);
    if (measure) {
      // Values for a pod RunPodSandbox refuses would be reference values for nothing.
      const image = report.tee?.guestImage;
      if (image != null && image.verity === null) {
        throw precondition(
          'GUEST_IMAGE_UNVERIFIED',
          `the guest image ${image.path} has no dm-verity metadata ${guestImageVerityPath(image.path)}, so handler "${report.handler}" pods are refused (build it with scripts/build-guest.sh)`,
        );
      }
      const doc = plannedReferenceValues({
        report,
        ovmfVarsTemplatePath: config.hypervisor.firmware.ovmfVarsPath,
        ...(request.config?.annotations === undefined ? {} : { annotations: request.config.annotations }),
        read: (p) => readMeasuredFile(p),
        cpuinfo: () => readFileSync('/proc/cpuinfo', 'utf8'),
      });
      io.stdout.write(measurementsOutput(doc, format as 'text' | 'json' | 'rvps'));
      return 0;
    }
    io.stdout.write(format === 'json' ? `${JSON.stringify(planJson(report), null, 2)}\n` : planText(report));
    return 0;
  } catch (err) {
    if (err instanceof UsageError) return fail(2, err.message);
    if (isKataError(err)) {
      const where = file !== '' && err.kind === 'invalid' && !err.message.includes(file) ? `${file}: ` : '';
      return fail(err.kind === 'invalid' || err.kind === 'not_found' ? 2 : 1, `${where}${err.message} [${err.reason}]`);
    }
    return fail(1, errorMessage(err));
  }
}

/** A file the planned argv names (kernel, initrd, firmware), read whole; a missing one is a coded error naming it. */
function readMeasuredFile(file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw invalid(
      'PLAN_MEASUREMENTS_UNAVAILABLE',
      `cannot read ${file}, which the planned VM boots from: ${errnoCode(err) ?? errorMessage(err)}`,
    );
  }
}

/** `plan --overhead`: the RuntimeClass(es) for the config's handlers. */
async function printOverhead(
  values: { config?: string; handler?: string; format?: string; accel?: string; request?: string },
  io: CliIo,
): Promise<number> {
  if (values.request !== undefined) throw new UsageError('--overhead takes no --request (it plans no pod)');
  const format = values.format ?? 'yaml';
  if (format !== 'yaml' && format !== 'json') throw new UsageError(`--format must be yaml or json with --overhead, got "${format}"`);
  const accel = values.accel;
  if (accel !== undefined && accel !== 'kvm' && accel !== 'tcg' && accel !== 'any')
    throw new UsageError(`--accel must be kvm, tcg or any, got "${accel}"`);
  const { config } = await loadConfig(values.config);
  const names = values.handler === undefined ? Object.keys(config.handlers) : [values.handler];
  const unknown = names.find((n) => config.handlers[n] === undefined);
  if (unknown !== undefined)
    throw new UsageError(`--handler "${unknown}" is not a handler of the config; handlers: ${Object.keys(config.handlers).join(', ')}`);
  const chosen: OverheadAccel = accel ?? defaultOverheadAccel(config);
  const classes = names.map((n) => runtimeClassOverhead(config, n, chosen));
  if (format === 'json') {
    const objects = classes.map(runtimeClassObject);
    io.stdout.write(`${JSON.stringify(objects.length === 1 ? objects[0] : objects, null, 2)}\n`);
  } else {
    io.stdout.write(classes.map(runtimeClassYaml).join('---\n'));
  }
  return 0;
}

/** The host's hardware TEEs and its QEMU's version, as the daemon reads them at start. */
async function teeFacts(qemuBinary: string): Promise<TeeFacts> {
  const qemu = await checkQemu(qemuBinary);
  return { host: detectHostTee(), qemuVersion: qemu.ok ? parseQemuVersion(qemu.message) : null };
}
