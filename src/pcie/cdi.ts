import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import { errnoCode, invalid, notFound, precondition } from '../common/errors.js';
import { compileOnce, describeSchemaErrors } from '../common/schema.js';
import { CDI_DEVICE_NAME_PATTERN, CDI_KIND_PATTERN, type CdiDeviceNode, type CdiSpecDocument, cdiSpecSchema } from './cdi-schema.js';
import type { VfioDeviceRequest } from './types.js';

const validateSpec = compileOnce<CdiSpecDocument>(cdiSpecSchema);

/** A spec file that was read and skipped; never fatal to the other specs. */
export interface CdiWarning {
  path: string;
  problems: string[];
}

export interface CdiDeviceEntry {
  /** `vendor.com/class=name` */
  qualifiedName: string;
  specPath: string;
  /** The device's own nodes followed by its spec's common nodes (applied with any device). */
  deviceNodes: CdiDeviceNode[];
}

export interface CdiRegistry {
  /** In ascending priority: a device in a later directory overrides the same device earlier. */
  dirs: string[];
  specPaths: string[];
  devices: Record<string, CdiDeviceEntry>;
  /** Devices defined twice at the same priority: unusable, as the CDI reference cache does. */
  conflicts: Record<string, string[]>;
  warnings: CdiWarning[];
}

/** A CDI device name the pod asked for, with where it came from (for messages). */
export interface CdiNameRequest {
  name: string;
  origin: string;
}

export interface ParsedCdiName {
  vendor: string;
  class: string;
  device: string;
}

const KIND_RE = new RegExp(CDI_KIND_PATTERN);
const DEVICE_RE = new RegExp(CDI_DEVICE_NAME_PATTERN);

/** Split `vendor.com/class=name`; undefined when it is not a fully-qualified CDI device name. */
export function parseQualifiedName(name: string): ParsedCdiName | undefined {
  const eq = name.indexOf('=');
  if (eq < 0) return undefined;
  const kind = name.slice(0, eq);
  const device = name.slice(eq + 1);
  if (!KIND_RE.test(kind) || !DEVICE_RE.test(device)) return undefined;
  const slash = kind.indexOf('/');
  return { vendor: kind.slice(0, slash), class: kind.slice(slash + 1), device };
}

async function readSpec(file: string): Promise<{ doc?: CdiSpecDocument; problems: string[] }> {
  let text: string;
  try {
    text = await fsp.readFile(file, 'utf8');
  } catch (err) {
    return { problems: [`cannot be read (${errnoCode(err) ?? String(err)})`] };
  }
  let data: unknown;
  try {
    data = file.endsWith('.json') ? JSON.parse(text) : parseYaml(text, { prettyErrors: false });
  } catch (err) {
    return { problems: [`is not valid ${file.endsWith('.json') ? 'JSON' : 'YAML'}: ${(err as Error).message.split('\n')[0]}`] };
  }
  const validate = validateSpec();
  if (!validate(data)) return { problems: describeSchemaErrors(validate.errors) };
  const seen = new Set<string>();
  for (const d of data.devices) {
    if (seen.has(d.name)) return { problems: [`/devices defines "${d.name}" more than once`] };
    seen.add(d.name);
  }
  return { doc: data, problems: [] };
}

/**
 * Load the CDI specs (`*.json`, `*.yaml`) from `dirs`, lowest priority first (the CDI default is
 * /etc/cdi then /var/run/cdi: generated specs override static ones). Missing directories are
 * normal. A malformed spec is reported in `warnings` with its path and skipped.
 */
export async function loadCdiSpecs(dirs: readonly string[]): Promise<CdiRegistry> {
  const registry: CdiRegistry = { dirs: [...dirs], specPaths: [], devices: {}, conflicts: {}, warnings: [] };
  const priority = new Map<string, number>();
  for (const [prio, dir] of dirs.entries()) {
    let names: string[];
    try {
      names = (await fsp.readdir(dir, { withFileTypes: true }))
        .filter((e) => !e.isDirectory())
        .map((e) => e.name)
        .sort();
    } catch (err) {
      if (errnoCode(err) === 'ENOENT' || errnoCode(err) === 'ENOTDIR') continue;
      registry.warnings.push({ path: dir, problems: [`cannot be listed (${errnoCode(err) ?? String(err)})`] });
      continue;
    }
    for (const name of names) {
      if (!name.endsWith('.json') && !name.endsWith('.yaml')) continue;
      const file = path.join(dir, name);
      const { doc, problems } = await readSpec(file);
      if (doc === undefined) {
        registry.warnings.push({ path: file, problems });
        continue;
      }
      registry.specPaths.push(file);
      const common = doc.containerEdits?.deviceNodes ?? [];
      for (const d of doc.devices) {
        const qualifiedName = `${doc.kind}=${d.name}`;
        const entry: CdiDeviceEntry = { qualifiedName, specPath: file, deviceNodes: [...(d.containerEdits?.deviceNodes ?? []), ...common] };
        const old = registry.devices[qualifiedName];
        const oldPrio = priority.get(qualifiedName);
        if (registry.conflicts[qualifiedName] !== undefined && oldPrio === prio) {
          registry.conflicts[qualifiedName]!.push(file);
          continue;
        }
        if (old !== undefined && oldPrio === prio) {
          registry.conflicts[qualifiedName] = [old.specPath, file];
          registry.warnings.push({
            path: file,
            problems: [`device ${qualifiedName} is also defined by ${old.specPath} at the same priority; neither is used`],
          });
          delete registry.devices[qualifiedName];
          continue;
        }
        delete registry.conflicts[qualifiedName];
        registry.devices[qualifiedName] = entry;
        priority.set(qualifiedName, prio);
      }
    }
  }
  return registry;
}

/** The `cdi.k8s.io/*` annotations: each value is a comma-separated list of qualified names. */
export function cdiNamesFromAnnotations(annotations: Readonly<Record<string, string>> | null | undefined): CdiNameRequest[] {
  const out: CdiNameRequest[] = [];
  for (const key of Object.keys(annotations ?? {}).sort()) {
    if (!key.startsWith('cdi.k8s.io/')) continue;
    for (const raw of annotations![key]!.split(',')) {
      const name = raw.trim();
      if (name !== '') out.push({ name, origin: `annotation ${key}` });
    }
  }
  return out;
}

export interface CdiResolution {
  /** VFIO nodes of the named devices, one request per node (the container node is dropped later). */
  requests: VfioDeviceRequest[];
  /** Named devices that bring no VFIO node (a VM cannot take them as PCI devices). */
  nonVfio: Array<{ name: string; origin: string; nodes: string[] }>;
}

/**
 * Pure: resolve fully-qualified CDI names to their device nodes, keeping those under /dev/vfio.
 * Unknown or conflicting names are refused (NOT_FOUND / FAILED_PRECONDITION) naming the dirs.
 */
export function resolveCdiDevices(registry: CdiRegistry, names: readonly CdiNameRequest[]): CdiResolution {
  const result: CdiResolution = { requests: [], nonVfio: [] };
  for (const { name, origin } of names) {
    if (parseQualifiedName(name) === undefined) {
      throw invalid('CDI_NAME_INVALID', `CDI device "${name}" (from ${origin}) is not a fully-qualified name like vendor.com/class=device`);
    }
    const conflict = registry.conflicts[name];
    if (conflict !== undefined) {
      throw precondition(
        'CDI_DEVICE_CONFLICT',
        `CDI device "${name}" (from ${origin}) is defined by both ${conflict.join(' and ')} at the same priority`,
      );
    }
    const entry = registry.devices[name];
    if (entry === undefined) {
      throw notFound(
        'CDI_DEVICE_UNKNOWN',
        `CDI device "${name}" (from ${origin}) is not defined by any spec in ${registry.dirs.join(', ') || '(no CDI dirs)'}`,
        {
          details: { name, dirs: registry.dirs, warnings: registry.warnings },
        },
      );
    }
    const hostPaths = entry.deviceNodes.map((n) => n.hostPath ?? n.path);
    const vfio = hostPaths.filter((p) => path.posix.normalize(p).startsWith('/dev/vfio/'));
    if (vfio.length === 0) result.nonVfio.push({ name, origin, nodes: hostPaths });
    for (const p of vfio) result.requests.push({ hostPath: p, origin: `CDI ${name} (${origin})` });
  }
  return result;
}
