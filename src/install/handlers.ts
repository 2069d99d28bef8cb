import type { ConfigSchema, ContainerdVersion } from './version.js';

/** The runtime handlers kata-ts installs: RuntimeClass handler name -> containerd runtime type. */
export const KATA_TS_RUNTIMES: readonly { handler: string; runtimeType: string; shimBinary: string }[] = [
  { handler: 'kata-ts', runtimeType: 'io.containerd.kata-ts.v2', shimBinary: 'containerd-shim-kata-ts-v2' },
  { handler: 'kata-ts-cvm', runtimeType: 'io.containerd.kata-ts-cvm.v2', shimBinary: 'containerd-shim-kata-ts-cvm-v2' },
];

/** Annotations containerd passes on to the shim: Kata's prefix, kata-ts's and CDI's (docs/shim.md). */
export const POD_ANNOTATIONS = ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*', 'cdi.k8s.io/*'];
export const CONTAINER_ANNOTATIONS = ['io.katacontainers.*', 'kata-ts.dev/*'];

/** The CRI plugin's runtimes table for a config schema, as key path below the document root. */
export function runtimesPath(schema: ConfigSchema): string[] {
  return schema === 2
    ? ['plugins', 'io.containerd.grpc.v1.cri', 'containerd', 'runtimes']
    : ['plugins', 'io.containerd.cri.v1.runtime', 'containerd', 'runtimes'];
}

/** `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts`: how the table is named in messages and headers. */
export function tableName(schema: ConfigSchema, handler: string): string {
  return [...runtimesPath(schema), handler].map(tomlKey).join('.');
}

function tomlKey(key: string): string {
  return /^[A-Za-z0-9_-]+$/.test(key) ? key : JSON.stringify(key);
}

/**
 * Which sandbox implementation containerd 2.x's CRI plugin uses for our handlers: `podsandbox`
 * (a pause container through the task API; every release) or `shim` (containerd's Sandbox API,
 * served by the shim itself; 2.x only). docs/shim.md says which to choose.
 */
export const SANDBOXERS = ['podsandbox', 'shim'] as const;
export type Sandboxer = (typeof SANDBOXERS)[number];

/** A handler's settings as containerd's TOML decoder sees them (key -> value). */
export type HandlerTable = Record<string, string | boolean | string[]>;

/**
 * What one handler's table holds for this release. A VM gets no host device by being privileged
 * (privileged_without_host_devices). 1.7 names the sandbox implementation `sandbox_mode`, 2.x
 * `sandboxer`: "podsandbox" (the default, written out so the table says what it relies on) runs
 * the shim beside containerd's pause sandbox; "shim" (2.x only, checked by the planner) hands the
 * shim the Sandbox API.
 */
export function handlerTable(
  version: ContainerdVersion,
  schema: ConfigSchema,
  runtimeType: string,
  sandboxer: Sandboxer = 'podsandbox',
): HandlerTable {
  const table: HandlerTable = {
    runtime_type: runtimeType,
    pod_annotations: [...POD_ANNOTATIONS],
    container_annotations: [...CONTAINER_ANNOTATIONS],
    privileged_without_host_devices: true,
  };
  if (version.major === 1 && version.minor === 7) table.sandbox_mode = 'podsandbox';
  // A version 2 file under 2.x is migrated: its `sandbox_mode` becomes `sandboxer`.
  if (version.major === 2) table[schema === 3 ? 'sandboxer' : 'sandbox_mode'] = sandboxer;
  return table;
}

function tomlValue(v: string | boolean | string[]): string {
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'string') return JSON.stringify(v);
  return `[${v.map((x) => JSON.stringify(x)).join(', ')}]`;
}

export const BLOCK_BEGIN =
  '# >>> kata-ts runtime handlers: written by `kata-ts install --containerd`, removed by `kata-ts uninstall --containerd` >>>';
export const BLOCK_END = '# <<< kata-ts runtime handlers <<<';

/** Both handlers' tables as TOML, one table each (no markers). */
export function renderTables(version: ContainerdVersion, schema: ConfigSchema, sandboxer: Sandboxer = 'podsandbox'): string {
  return KATA_TS_RUNTIMES.map(({ handler, runtimeType }) => {
    const table = handlerTable(version, schema, runtimeType, sandboxer);
    return [`[${tableName(schema, handler)}]`, ...Object.entries(table).map(([k, v]) => `  ${k} = ${tomlValue(v)}`)].join('\n');
  }).join('\n\n');
}
