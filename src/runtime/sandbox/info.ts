import { missingFeatures } from '../../agent-client/index.js';
import type { CgroupDriver } from '../../cgroups/index.js';
import { errorMessage } from '../../common/errors.js';
import { AGENT_API_VERSION } from '../../generated/agent/agent.js';
import { isSameLiveProcess, type QmpPciBus, type QmpPciDevice, type VmProcess } from '../../hypervisor/index.js';
import type { PodNetworkRecord } from '../../network/index.js';
import type { LiveSandbox } from './types.js';

/** Sizes as QEMU itself reports them (not as planned): what the VM really has right now. */
export interface QmpSizes {
  vcpus: number;
  baseMemoryMiB: number;
  pluggedMemoryMiB: number;
}

const MiB = 1024 * 1024;

export async function qmpSizes(vm: VmProcess, timeoutMs = 3000): Promise<QmpSizes> {
  const [cpus, memory] = await Promise.all([vm.qmp.queryCpusFast({ timeoutMs }), vm.qmp.queryMemorySizeSummary({ timeoutMs })]);
  return {
    vcpus: cpus.length,
    baseMemoryMiB: Math.round(memory['base-memory'] / MiB),
    pluggedMemoryMiB: Math.round((memory['plugged-memory'] ?? 0) / MiB),
  };
}

/** What sits behind each PCIe port (bridge) as QEMU reports it: endpoint qdev ids per port id. */
export interface PortOccupancy {
  port: string;
  devices: string[];
}

export function portOccupancy(buses: QmpPciBus[]): PortOccupancy[] {
  const out: PortOccupancy[] = [];
  const walk = (devices: QmpPciDevice[]): void => {
    for (const d of devices) {
      if (d.pci_bridge === undefined) continue;
      const children = d.pci_bridge.devices ?? [];
      out.push({ port: d.qdev_id, devices: children.filter((c) => c.pci_bridge === undefined).map((c) => c.qdev_id) });
      walk(children);
    }
  };
  for (const bus of buses) walk(bus.devices);
  return out;
}

/** The agent's session as the daemon holds it: connected or not, and what its latest Hello said. */
function agentInfo(live: LiveSandbox): Record<string, unknown> | null {
  if (live.agent === undefined) return null;
  const hello = live.agent.connection.hello;
  return {
    connected: live.agent.connection.connected,
    apiVersion: hello?.apiVersion ?? null,
    // An agent one API back (a pod started before an upgrade) works without what came since.
    hostApiVersion: AGENT_API_VERSION,
    missingFeatures: hello === undefined ? [] : missingFeatures(hello.apiVersion).map((f) => f.feature),
    agentVersion: hello?.agentVersion ?? null,
    agentInstanceId: hello?.agentInstanceId ?? null,
  };
}

/**
 * PodSandboxStatus verbose info (the JSON string under "info", as containerd and CRI-O do): the
 * plan, the VMM's pid and acceleration, where it was placed, what QMP and the guest report.
 */
export async function sandboxVerboseInfo(live: LiveSandbox, cgroups: CgroupDriver): Promise<Record<string, string>> {
  const { record, vm } = live;
  let qmp: QmpSizes | { error: string } | null = null;
  let pci: PortOccupancy[] | { error: string } | null = null;
  if (vm !== undefined && vm.exitInfo === undefined) {
    [qmp, pci] = await Promise.all([
      qmpSizes(vm).catch((err: unknown) => ({ error: errorMessage(err) })),
      vm.qmp.queryPci({ timeoutMs: 3000 }).then(portOccupancy, (err: unknown) => ({ error: errorMessage(err) })),
    ]);
  }
  const info = {
    handler: record.handler,
    runtimeHandler: record.runtimeHandler,
    phase: record.phase,
    pid: record.vmm?.pid ?? null,
    accel: record.plan.qemu.accel,
    workDir: record.vmm?.workDir ?? null,
    // How the VMM runs: its seccomp option, uid/gid (null: root), jail; null for a format-5 sandbox.
    confinement: record.confinement,
    cgroup: record.placement === null ? { driver: cgroups.name, placed: false } : cgroups.describe(record.placement),
    shape: record.shape,
    qmp,
    pci,
    topology: record.topology.ports.map((p) => ({
      id: p.id,
      use: p.use,
      reservedFor: p.reservedFor,
      occupant: p.occupant?.qemuId ?? null,
    })),
    guest: record.guest,
    agent: agentInfo(live),
    virtiofsd:
      record.virtiofsd === null
        ? null
        : { pid: record.virtiofsd.pid, running: isSameLiveProcess(record.virtiofsd.pid, record.virtiofsd.startTimeTicks) },
    guestPod: record.guestPod,
    // The TEE the pod got and why (absent from the plan: planned before TEE profiles, none).
    tee: { kind: record.plan.tee?.kind ?? 'none', reason: record.plan.tee?.reason ?? 'planned before TEE profiles' },
    tpm: tpmInfo(record),
    // The launch measurements predicted before boot (kata-ts/reference-values/v1), null without a TEE.
    referenceValues: record.referenceValues ?? null,
    network: networkInfo(record.network),
    exit: record.exit,
    // From the pool or cold, and why not from the pool (docs/pool.md).
    origin: record.origin ?? null,
    plan: {
      source: record.plan.sizing.source,
      vm: record.plan.sizing.vm,
      host: record.plan.sizing.host,
      workload: record.plan.sizing.workload,
      containers: record.plan.sizing.containers,
      pcie: record.plan.pcie.description,
      qemu: record.plan.qemu,
      vmm: record.plan.vmm,
      tee: record.plan.tee ?? null,
    },
  };
  return { info: JSON.stringify(info) };
}

/** A vtpm pod's swtpm: its pid, whether it runs, its identity and the EK certificate its TPM presents. */
function tpmInfo(record: LiveSandbox['record']): Record<string, unknown> | null {
  const t = record.tpm;
  if (t === undefined || t === null) return null;
  return {
    pid: t.pid,
    running: isSameLiveProcess(t.pid, t.startTimeTicks),
    uid: t.identity?.uid ?? null,
    stateDir: t.stateDir,
    ekCertPem: t.ekCertPem,
  };
}

/** The pod network as verbose status shows it: a joined namespace has no CNI part of ours. */
function networkInfo(net: PodNetworkRecord | null): Record<string, unknown> | null {
  if (net === null) return null;
  const common = {
    kind: net.kind,
    netns: net.netnsPath,
    ifName: net.ifName,
    tap: net.tapName,
    mac: net.mac,
    mtu: net.mtu,
    result: net.result,
    tapWired: net.tapWired,
  };
  return net.kind === 'joined'
    ? common
    : { ...common, cniNetwork: net.cniNetwork.name, cniConfig: net.cniNetwork.file, cniAttached: net.cniAttached };
}
