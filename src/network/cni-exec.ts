/**
 * Running CNI plugins (the CNI spec's "execution protocol"): each plugin of a network list in
 * order for ADD, each handed the previous one's result, and in reverse order for DEL. The plugin
 * gets its configuration on stdin and the CNI_* variables in its environment, and answers on
 * stdout (a result, or an error object).
 */
import { spawn } from 'node:child_process';
import { internal } from '../common/errors.js';
import type { CniNetworkList, CniPluginConf } from './cni-config.js';
import './reasons.js';

/** What identifies one attachment: the same for ADD and for every later DEL. */
export interface CniAttachment {
  containerId: string;
  netnsPath: string;
  ifName: string;
  /** CNI_ARGS (`K=V;K=V`): the kubelet's K8S_POD_* keys. */
  args: string;
  /** runtimeConfig handed to plugins that declare the capability (e.g. `portMappings`). */
  runtimeConfig: Record<string, unknown>;
}

export interface CniExecOptions {
  /** Each plugin's path, in the list's order (resolvePlugins). */
  pluginPaths: readonly string[];
  binDirs: readonly string[];
  timeoutMs: number;
}

/** A CNI port mapping (the portmap plugin's `portMappings` capability). */
export interface CniPortMapping {
  hostPort: number;
  containerPort: number;
  protocol: 'tcp' | 'udp' | 'sctp';
  hostIP?: string;
}

/** The plugin's stdin: its own keys, the list's name and version, capabilities' runtimeConfig, prevResult. */
export function pluginStdin(
  list: CniNetworkList,
  plugin: CniPluginConf,
  runtimeConfig: Record<string, unknown>,
  prevResult: unknown,
): Record<string, unknown> {
  const wanted = Object.entries(plugin.capabilities ?? {})
    .filter(([cap, on]) => on && runtimeConfig[cap] !== undefined)
    .map(([cap]) => [cap, runtimeConfig[cap]]);
  return {
    ...plugin,
    cniVersion: list.cniVersion,
    name: list.name,
    ...(wanted.length > 0 ? { runtimeConfig: Object.fromEntries(wanted) } : {}),
    ...(prevResult === undefined ? {} : { prevResult }),
  };
}

/** ADD through the whole list; the last plugin's result is the attachment's. */
export async function cniAdd(list: CniNetworkList, att: CniAttachment, opts: CniExecOptions): Promise<unknown> {
  let prev: unknown;
  for (const [i, plugin] of list.plugins.entries()) {
    prev = await runPlugin('ADD', opts.pluginPaths[i]!, pluginStdin(list, plugin, att.runtimeConfig, prev), att, opts);
  }
  return prev;
}

/**
 * DEL through the list in reverse. Every plugin is asked even when one fails (each frees its own
 * part: the veth, the IPAM allocation, the iptables rules); the first failure is thrown at the end.
 * `prevResult` is ADD's result where it is known (a DEL after a crash mid-ADD has none).
 */
export async function cniDel(list: CniNetworkList, att: CniAttachment, opts: CniExecOptions, prevResult: unknown): Promise<void> {
  let first: unknown;
  for (let i = list.plugins.length - 1; i >= 0; i--) {
    try {
      await runPlugin(
        'DEL',
        opts.pluginPaths[i]!,
        pluginStdin(list, list.plugins[i]!, att.runtimeConfig, prevResult ?? undefined),
        att,
        opts,
      );
    } catch (err) {
      first ??= err;
    }
  }
  if (first !== undefined) throw first;
}

function runPlugin(
  command: 'ADD' | 'DEL',
  pluginPath: string,
  stdin: Record<string, unknown>,
  att: CniAttachment,
  opts: CniExecOptions,
): Promise<unknown> {
  const env = {
    PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    CNI_COMMAND: command,
    CNI_CONTAINERID: att.containerId,
    CNI_NETNS: att.netnsPath,
    CNI_IFNAME: att.ifName,
    CNI_ARGS: att.args,
    CNI_PATH: opts.binDirs.join(':'),
  };
  const what = `CNI ${command} of plugin ${String(stdin.type)}`;
  return new Promise((resolve, reject) => {
    const child = spawn(pluginPath, [], { env, stdio: ['pipe', 'pipe', 'pipe'], timeout: opts.timeoutMs, killSignal: 'SIGKILL' });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    child.on('error', (e) => reject(internal('CNI_PLUGIN_FAILED', `${what} could not run: ${e.message}`)));
    child.on('close', (code, signal) => {
      const text = Buffer.concat(out).toString('utf8').trim();
      if (code === 0) {
        if (command === 'DEL' || text === '') return resolve(undefined);
        try {
          return resolve(JSON.parse(text));
        } catch {
          return reject(internal('CNI_PLUGIN_FAILED', `${what} printed no JSON result: ${text.slice(0, 200)}`));
        }
      }
      let msg = Buffer.concat(err).toString('utf8').trim();
      try {
        const e = JSON.parse(text) as { msg?: string; details?: string; code?: number };
        msg = [e.msg, e.details].filter((s) => s !== undefined && s !== '').join(': ') || msg;
      } catch {
        msg ||= text;
      }
      const how = signal === null ? `exit ${code}` : `signal ${signal} (timeout ${opts.timeoutMs} ms?)`;
      reject(internal('CNI_PLUGIN_FAILED', `${what} failed (${how}): ${msg.slice(0, 500)}`));
    });
    child.stdin.on('error', () => undefined); // a plugin that exits without reading: reported by 'close'
    child.stdin.end(JSON.stringify(stdin));
  });
}
