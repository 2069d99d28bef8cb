/**
 * A pod's network, set up and torn down: its namespace, the CNI attachment in it, the TAP wiring;
 * or, for a namespace the caller made and attached (joined, see joined.ts), the TAP wiring alone.
 * Every step is recorded (PodNetworkRecord, saved by the caller through `persist`) before or as it
 * is done, so that teardown, also the one at the next start after a crash, knows what to undo.
 * Teardown is idempotent: CNI DEL is safe to repeat, and missing devices or namespaces are fine.
 */
import { errorMessage, invalid } from '../common/errors.js';
import type { Logger } from '../common/logger.js';
import type { NetworkConfig } from '../config/types.js';
import { type CniNetworkList, loadCniNetwork, resolvePlugins } from './cni-config.js';
import { type CniPortMapping, cniAdd, cniDel } from './cni-exec.js';
import { readJoinedNetwork } from './joined.js';
import { type CniPodNetworkRecord, type JoinedPodNetworkRecord, netnsRefOf, type PodNetworkRecord } from './record.js';
import { parseCniResult } from './result.js';
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
  type TapOptions,
} from './wiring.js';
import './reasons.js';

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
  async prepare(sandboxId: string, req: PodNetworkRequest): Promise<CniPodNetworkRecord> {
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
      kind: 'cni',
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
   * A namespace the caller made and attached (joinNetns): checked and read, nothing changed (see
   * joined.ts). The record holds what the guest is told, the MAC and the MTU already.
   */
  async prepareJoin(netnsPath: string): Promise<JoinedPodNetworkRecord> {
    return readJoinedNetwork(netnsPath);
  }

  /**
   * Namespace, CNI ADD, TAP (a joined namespace: the TAP only): `net` is changed in place and
   * `persist` called before each step that leaves something to undo. On failure the caller runs
   * teardown (which undoes what was recorded). `tapOwner`: the TAP is made for that uid and gid
   * (`ip tuntap add ... user U group G`), so an unprivileged QEMU may attach to it.
   */
  async setup(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger, options: TapOptions = {}): Promise<void> {
    if (net.kind === 'joined') {
      const started = Date.now();
      await this.wire(net, persist, options);
      log.info(
        { netns: net.netnsPath, ips: net.result?.ips, mac: net.mac, mtu: net.mtu, wiringMs: Date.now() - started },
        'pod network joined',
      );
      return;
    }
    if (options.netnsMade !== true) await createNetns(net.netnsName);
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
    await this.wire(net, persist, options);
    log.info(
      { netns: net.netnsName, ips: net.result.ips, mac, mtu, cniMs, wiringMs: Date.now() - started - cniMs },
      'pod network attached',
    );
  }

  /** The TAP and its filters, recorded first: a crash half-way is unwired all the same. */
  private async wire(net: PodNetworkRecord, persist: () => Promise<void>, options: TapOptions): Promise<void> {
    // Known before wiring (linkInfo, or the joined namespace read at prepare): null here is a bug.
    if (net.mtu === null) throw new Error('the pod network is wired without an MTU');
    net.tapWired = true;
    await persist();
    await runAll(planTapWiring(netnsRefOf(net), net.ifName, net.tapName, net.mtu, options.tapOwner));
  }

  /**
   * StopPodSandbox's half (also rollback's): TAP and filters, then CNI DEL (not for a joined
   * namespace: its CNI is the caller's). `persist` records each step done. The namespace stays
   * (RemovePodSandbox removes one of ours, teardown).
   */
  async detach(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger): Promise<void> {
    if (net.tapWired) {
      const failures = await runAll(planTapUnwiring(netnsRefOf(net), net.ifName, net.tapName), true);
      if (failures.length > 0) log.debug({ failures }, 'TAP unwiring found parts gone already');
      net.tapWired = false;
      await persist();
    }
    if (net.kind === 'cni' && net.cniAttached) {
      await cniDel(net.cniNetwork, net.attachment, await this.execOptions(net.cniNetwork), net.cniResult ?? undefined);
      net.cniAttached = false;
      await persist();
      log.info({ netns: net.netnsName }, 'CNI DEL done');
    }
  }

  /** detach, then the namespace itself (RemovePodSandbox, rollback); a joined one is the caller's and stays. */
  async teardown(net: PodNetworkRecord, persist: () => Promise<void>, log: Logger): Promise<void> {
    await this.detach(net, persist, log);
    if (net.kind === 'joined') return;
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
