/**
 * The node's CNI network configuration: the first `.conflist`, `.conf` or `.json` file of the
 * configured directory in lexical order (what containerd and CRI-O use), a single-plugin `.conf`
 * read as a list of one. Loading checks that every plugin's binary exists, so that Status can
 * name a missing one and RunPodSandbox refuses before it creates anything.
 */
import { constants as fsConstants, promises as fsp } from 'node:fs';
import path from 'node:path';
import { errnoCode, invalid, precondition } from '../common/errors.js';
import type { NetworkConfig } from '../config/types.js';
import './reasons.js';

/** One plugin of a network list, as written in the file (its own keys are passed on unchanged). */
export interface CniPluginConf {
  type: string;
  capabilities?: Record<string, boolean>;
  [key: string]: unknown;
}

/** A network configuration list (CNI spec "network configuration list"). */
export interface CniNetworkList {
  cniVersion: string;
  name: string;
  plugins: CniPluginConf[];
  /** The file it came from (for messages and the record). */
  file: string;
}

const EXTENSIONS = new Set(['.conflist', '.conf', '.json']);
/** Result formats we can read: the ones with `interfaces`/`ips` lists (0.3.0 and later). */
const SUPPORTED_VERSIONS = /^(0\.3\.[01]|0\.4\.0|1\.[0-9]+\.[0-9]+)$/;

/** Pure: one configuration file's text -> the network list it describes. Throws CNI_CONFIG_INVALID naming the field. */
export function parseCniConfig(text: string, file: string): CniNetworkList {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw invalid('CNI_CONFIG_INVALID', `CNI config ${file} is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    throw invalid('CNI_CONFIG_INVALID', `CNI config ${file} is not a JSON object.`);
  const o = doc as Record<string, unknown>;
  const bad = (field: string, what: string): never => {
    throw invalid('CNI_CONFIG_INVALID', `CNI config ${file}: ${field} ${what}.`);
  };
  if (typeof o.name !== 'string' || o.name === '') bad('name', 'must be a non-empty string');
  if (typeof o.cniVersion !== 'string' || !SUPPORTED_VERSIONS.test(o.cniVersion)) {
    bad('cniVersion', `is ${JSON.stringify(o.cniVersion)}; kata-ts reads results of CNI 0.3.0 and later`);
  }
  const raw = file.endsWith('.conflist') || Array.isArray(o.plugins) ? o.plugins : [o];
  if (!Array.isArray(raw) || raw.length === 0) bad('plugins', 'must be a non-empty list');
  const plugins = (raw as unknown[]).map((p, i): CniPluginConf => {
    if (typeof p !== 'object' || p === null) return bad(`plugins[${i}]`, 'must be an object');
    const type = (p as Record<string, unknown>).type;
    if (typeof type !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(type))
      return bad(`plugins[${i}].type`, 'must name a plugin binary');
    const { cniVersion: _v, name: _n, ...rest } = p as Record<string, unknown>;
    return rest as CniPluginConf;
  });
  return { cniVersion: o.cniVersion as string, name: o.name as string, plugins, file };
}

/** The network list the node is configured with; CNI_CONFIG_MISSING when the directory holds none. */
export async function loadCniNetwork(confDir: string): Promise<CniNetworkList> {
  let names: string[];
  try {
    names = await fsp.readdir(confDir);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') throw precondition('CNI_CONFIG_MISSING', `no CNI network config: ${confDir} does not exist.`);
    throw err;
  }
  const files = names.filter((n) => EXTENSIONS.has(path.extname(n))).sort();
  for (const name of files) {
    const file = path.join(confDir, name);
    const text = await fsp.readFile(file, 'utf8');
    const list = parseCniConfig(text, file);
    if ((JSON.parse(text) as { disabled?: unknown }).disabled === true) continue;
    return list;
  }
  throw precondition('CNI_CONFIG_MISSING', `no CNI network config (.conflist, .conf or .json) in ${confDir}.`);
}

/** The path of plugin `type` in the first of `binDirs` that has it as an executable file. */
export async function findPlugin(binDirs: readonly string[], type: string): Promise<string | undefined> {
  for (const dir of binDirs) {
    const candidate = path.join(dir, type);
    try {
      await fsp.access(candidate, fsConstants.X_OK);
      if ((await fsp.stat(candidate)).isFile()) return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** Every plugin of `list` resolved to its binary; CNI_PLUGIN_MISSING names the first one not found. */
export async function resolvePlugins(list: CniNetworkList, binDirs: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const plugin of list.plugins) {
    const found = await findPlugin(binDirs, plugin.type);
    if (found === undefined) {
      throw precondition('CNI_PLUGIN_MISSING', `CNI plugin "${plugin.type}" of ${list.file} is in none of ${binDirs.join(', ')}.`);
    }
    out.push(found);
  }
  return out;
}

/** Status's NetworkReady condition: a valid config whose plugins all exist. */
export interface NetworkReadiness {
  ready: boolean;
  reason: string;
  message: string;
}

export async function networkReadiness(config: NetworkConfig): Promise<NetworkReadiness> {
  if (config.mode === 'none') {
    return { ready: false, reason: 'NetworkDisabled', message: 'network.mode is "none": pod VMs get no network interface' };
  }
  try {
    const list = await loadCniNetwork(config.cniConfDir);
    await resolvePlugins(list, config.cniBinDirs);
    return { ready: true, reason: '', message: `CNI network "${list.name}" from ${list.file}` };
  } catch (err) {
    const reason = (err as { reason?: string }).reason;
    return {
      ready: false,
      reason: reason === 'CNI_PLUGIN_MISSING' ? 'CniPluginMissing' : reason === 'CNI_CONFIG_INVALID' ? 'CniConfigInvalid' : 'NoCniConfig',
      message: (err as Error).message,
    };
  }
}
