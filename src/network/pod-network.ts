/**
 * A pod's network, set up and torn down: its namespace, the CNI attachment in it, the TAP wiring.
 * Every step is recorded (PodNetworkRecord, saved by the caller through `persist`) before or as it
 * is done, so that teardown, also the one at the next start after a crash, knows what to undo.
 * Teardown is idempotent: CNI DEL is safe to repeat, and missing devices or namespaces are fine.
 */
import { errorMessage, invalid } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { NetworkConfig } from '../config/types.js';
import { type CniNetworkList, loadCniNetwork, resolvePlugins } from './cni-config.js';
import { type CniAttachment, type CniPortMapping, cniAdd, cniDel } from './cni-exec.js';
import { type PodNetworkResult, parseCniResult } from './result.js';
import {
  createNetns,
  deleteNetns,
  linkInfo,
  NETNS_DIR,
  netnsNameFor,
  POD_IF_NAME,
  POD_TAP_NAME,
  planTapUnwiring,
  planTapWiring,
  runAll,
} from './wiring.js';
import './reasons.js';

/** What a sandbox record keeps of its network (format 4). */
export interface PodNetworkRecord {
  netnsName: string;
  netnsPath: string;
  ifName: string;
  tapName: string;
  /** The network list ADD ran with: DEL must run the same one, whatever the node's config says later. */
  cniNetwork: CniNetworkList;
  attachment: CniAttachment;
  /** True from just before CNI ADD until a DEL succeeded: DEL is due (also after a crash). */
  cniAttached: boolean;
  /** ADD's raw result (DEL's prevResult) and what the pod got from it. */
  cniResult: unknown;
  result: PodNetworkResult | null;
  /** The CNI interface's MAC and MTU, which the VM's NIC takes. */
  mac: string | null;
  mtu: number | null;
  tapWired: boolean;
}

/** What prepare needs to know of the pod (from its CRI config; see src/runtime/sandbox/network.ts). */
export interface PodNetworkRequest {
  /** namespace_options.network is NODE: refused, a VM cannot share the host's stack. */
  hostNetwork: boolean;
  portMappings: CniPortMapping[];
  /** CNI_ARGS (`K=V;...`). */
  cniArgs: string;
}

export class PodNetworks {
  constructor(private readonly config: NetworkConfig) {}

  /** Validate before anything is made: a host-network pod is refused, the node's CNI config must be usable. */
  async prepare(sandboxId: string, req: PodNetworkRequest): Promise<PodNetworkRecord> {
    if (req.hostNetwork) {
      throw invalid(
        'POD_HOST_NETWORK_UNSUPPORTED',
        'linux.security_context.namespace_options.network is NODE: a pod VM cannot share the host network stack.',
      );
    }
    const cniNetwork = await loadCniNetwork(this.config.cniConfDir);
    await resolvePlugins(cniNetwork, this.config.cniBinDirs);
    const netnsName = netnsNameFor(sandboxId);
    const netnsPath = `${NETNS_DIR}/${netnsName}`;
    const mappings = req.portMappings;
    return {
      netnsName,
      netnsPath,
      ifName: POD_IF_NAME,
      tapName: POD_TAP_NAME,
      cniNetwork,
      attachment: {
        containerId: sandboxId,
        netnsPath,
        ifName: POD_IF_NAME,
        args: req.cniArgs,
        runtimeConfig: mappings.length > 0 ? { portMappings: mappings } : {},
      },
      cniAttached: false,
      cniResult: null,
      result: null,
      mac: null,
      mtu: null,
      tapWired: false,
    };
  }

  /**
   * Namespace, CNI ADD, TAP: `net` is changed in place and `persist` called before each step that
   * leaves something to undo. On failure the caller runs teardown (which undoes what was recorded).
   */
  async setup(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger): Promise<void> {
    await createNetns(net.netnsName);
    net.cniAttached = true; // before ADD: a crash inside ADD must still be followed by DEL
    await persist();
    const started = Date.now();
    net.cniResult = await cniAdd(net.cniNetwork, net.attachment, await this.execOptions(net.cniNetwork));
    net.result = parseCniResult(net.cniResult, net.ifName);
    await persist();
    const cniMs = Date.now() - started;
    const { mac, mtu } = await linkInfo(net.netnsName, net.ifName);
    net.mac = mac;
    net.mtu = mtu;
    net.tapWired = true;
    await persist();
    await runAll(planTapWiring(net.netnsName, net.ifName, net.tapName, mtu));
    log.info(
      { netns: net.netnsName, ips: net.result.ips, mac, mtu, cniMs, wiringMs: Date.now() - started - cniMs },
      'pod network attached',
    );
  }

  /**
   * StopPodSandbox's half (also rollback's): TAP and filters, then CNI DEL. `persist` records
   * each step done. The namespace stays (RemovePodSandbox removes it, removeNetns).
   */
  async detach(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger): Promise<void> {
    if (net.tapWired) {
      const failures = await runAll(planTapUnwiring(net.netnsName, net.ifName, net.tapName), true);
      if (failures.length > 0) log.debug({ failures }, 'TAP unwiring found parts gone already');
      net.tapWired = false;
      await persist();
    }
    if (net.cniAttached) {
      await cniDel(net.cniNetwork, net.attachment, await this.execOptions(net.cniNetwork), net.cniResult ?? undefined);
      net.cniAttached = false;
      await persist();
      log.info({ netns: net.netnsName }, 'CNI DEL done');
    }
  }

  /** detach, then the namespace itself (RemovePodSandbox, rollback). */
  async teardown(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger): Promise<void> {
    await this.detach(net, persist, log);
    try {
      await deleteNetns(net.netnsName);
    } catch (err) {
      log.error({ err: errorMessage(err), netns: net.netnsName }, 'removing the pod network namespace failed');
      throw err;
    }
  }

  private async execOptions(list: CniNetworkList) {
    return {
      pluginPaths: await resolvePlugins(list, this.config.cniBinDirs),
      binDirs: this.config.cniBinDirs,
      timeoutMs: this.config.cniTimeoutMs,
    };
  }
}
