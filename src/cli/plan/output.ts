import type { AccelerationChoice } from '../../hypervisor/index.js';
import type { PodPciePlan } from '../../pcie/index.js';
import type { TeePlan, VmmConfinementPlan } from '../../runtime/plan.js';
import type { HostCapacity, SizingPlan, VmmOverheadSource } from '../../sizing/types.js';

/**
 * What `kata-ts plan` prints, built from sections. Each section contributes one JSON key and a
 * block of the text report; a later planner (the PCIe topology, the QEMU argv) adds its result to
 * PlanReport and one entry to PLAN_SECTIONS.
 */
export interface PlanReport {
  handler: string;
  pod: { name: string; namespace: string; uid: string };
  hostCapacity: HostCapacity;
  sizing: SizingPlan;
  pcie: PodPciePlan;
  qemu: { binary: string; accel: AccelerationChoice; argv: string[]; workDir: string };
  /** The pod's NIC (network.mode "cni"); null without pod networking. */
  network: PlanNetwork | null;
  /** How QEMU is confined (the handler's vmmConfinement), and where its jail would be. */
  vmm: PlanVmm;
  /** The TEE the pod gets on this host, and why; whether this host can start it. */
  tee?: TeePlan;
}

/** The VMM's confinement as planned: the identity is taken at RunPodSandbox (the first free of the range). */
export interface PlanVmm extends VmmConfinementPlan {
  /** Where the identity leases are (node-wide); null when QEMU runs as root. */
  leaseDir: string | null;
  jailDir: string | null;
  vmmDir: string | null;
}

/** The network part of a plan: where the NIC sits and what RunPodSandbox will fill in from CNI. */
export interface PlanNetwork {
  cniConfDir: string;
  netns: string;
  tapName: string;
  /** `bus=pcie.0,addr=06.0` */
  slot: string;
  vhost: boolean;
  /** The MAC in the argv shown: a placeholder; RunPodSandbox uses the CNI interface's MAC (and MTU). */
  plannedMac: string;
}

export interface PlanSection {
  key: string;
  json: (report: PlanReport) => unknown;
  text: (report: PlanReport) => string[];
}

const MiB = 1024 * 1024;

function bytes(n: number): string {
  for (const [suffix, size] of [
    ['Gi', 1024 * MiB],
    ['Mi', MiB],
    ['Ki', 1024],
  ] as const) {
    if (n !== 0 && n % size === 0) return `${n / size}${suffix}`;
  }
  return String(n);
}

function cpu(millis: number): string {
  return millis % 1000 === 0 ? String(millis / 1000) : `${millis}m`;
}

function overheadSource(s: VmmOverheadSource): string {
  return s === 'pod_overhead' ? 'RuntimeClass overhead' : s === 'crio_annotations' ? 'CRI-O annotation' : 'handler';
}

const SOURCE_NOTES: Record<string, string> = {
  pod_resources: 'every container announced, KEP-4112',
  linux_resources: 'summed cgroup numbers from the kubelet',
  containerd_annotations: 'containerd sandbox annotations',
  crio_annotations: 'CRI-O PodLinuxResources annotation',
  handler_defaults: 'nothing given: handler defaults',
};

/** Rows padded into columns. */
export function table(rows: string[][], indent = '  '): string[] {
  const widths = rows.reduce<number[]>((w, row) => row.map((cell, i) => Math.max(w[i] ?? 0, cell.length)), []);
  return rows.map(
    (row) =>
      indent +
      row
        .map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!)))
        .join('  ')
        .trimEnd(),
  );
}

const summary: PlanSection = {
  key: 'summary',
  json: () => undefined,
  text: (r) =>
    table(
      [
        ['pod', `${r.pod.namespace}/${r.pod.name}`],
        ['handler', r.handler],
        ['source', `${r.sizing.source} (${SOURCE_NOTES[r.sizing.source] ?? ''})`],
        ['host', `${r.hostCapacity.cpus} CPUs, ${r.hostCapacity.memoryMiB} MiB`],
      ],
      '',
    ),
};

const vm: PlanSection = {
  key: 'vm',
  json: (r) => r.sizing.vm,
  text: (r) => {
    const v = r.sizing.vm;
    const pages = v.hugepages.map((h) => `${h.count} x ${h.pageSize}`).join(', ');
    return [
      'VM',
      ...table([
        ['vCPUs', `${v.vcpus}${v.maxVcpus > v.vcpus ? ` (hot-plug up to ${v.maxVcpus})` : ' (static)'}`],
        ['memory', `${v.memoryMiB} MiB${v.maxMemoryMiB > v.memoryMiB ? ` (hot-plug up to ${v.maxMemoryMiB} MiB)` : ' (static)'}`],
        ['hugepages', pages === '' ? 'none' : pages],
        ['kernel params', v.kernelParams.length === 0 ? '-' : v.kernelParams.join(' ')],
        [
          'free page reporting',
          r.sizing.vmmOverhead.balloonBytes
            ? 'on (virtio-balloon free-page-reporting=on: freed guest memory goes back to the host; never inflated)'
            : 'off (handler vm.freePageReporting; always off for a confidential handler, whose private pages the host must not discard)',
        ],
      ]),
    ];
  },
};

const host: PlanSection = {
  key: 'host',
  json: (r) => {
    const shortfall = r.sizing.overheadShortfallBytes;
    return shortfall === undefined ? r.sizing.host : { ...r.sizing.host, overheadShortfallBytes: shortfall };
  },
  text: (r) => {
    const h = r.sizing.host;
    const o = r.sizing.vmmOverhead;
    const shortfall = r.sizing.overheadShortfallBytes;
    return [
      'Host budget (VMM cgroup)',
      ...table([
        [
          'memory limit',
          `${bytes(h.memoryLimitBytes)} (VM ${r.sizing.vm.memoryMiB}Mi + VMM ${bytes(o.memoryBytes)} from ${overheadSource(o.memorySource)}${o.translationCacheBytes ? ` + TCG translation cache ${bytes(o.translationCacheBytes)}` : ''}${o.balloonBytes ? ` + balloon ${bytes(o.balloonBytes)}` : ''})`,
        ],
        [
          'CPU quota',
          `${cpu(h.cpuQuotaMillicores)} (${r.sizing.vm.vcpus} vCPU${r.sizing.vm.vcpus === 1 ? '' : 's'} + VMM ${cpu(o.cpuMillicores)} from ${overheadSource(o.cpuSource)})`,
        ],
        ['CPU request', cpu(h.cpuRequestMillicores)],
        ...(shortfall === undefined
          ? []
          : [
              [
                'pod overhead short',
                `${bytes(shortfall)}: the containers' limits plus the pod's overhead (the kubelet's pod cgroup) are below this budget; give the RuntimeClass \`kata-ts plan --overhead\`'s podFixed`,
              ] as [string, string],
            ]),
      ]),
    ];
  },
};

const vmmOverhead: PlanSection = { key: 'vmmOverhead', json: (r) => r.sizing.vmmOverhead, text: () => [] };

function others(hugepages: Record<string, number>, extended: Record<string, string>): string {
  const parts = [
    ...Object.entries(hugepages).map(([size, n]) => `hugepages-${size}=${bytes(n)}`),
    ...Object.entries(extended).map(([name, n]) => `${name}=${n}`),
  ];
  return parts.length === 0 ? '-' : parts.join(' ');
}

const workload: PlanSection = {
  key: 'workload',
  json: (r) => r.sizing.workload,
  text: (r) => {
    const w = r.sizing.workload;
    return [
      'Workload',
      ...table([
        ['CPU', `request ${cpu(w.cpuRequestMillicores)}, limit ${cpu(w.cpuLimitMillicores)}`],
        ['memory', `request ${bytes(w.memoryRequestBytes)}, limit ${bytes(w.memoryLimitBytes)}`],
        ['other', others(w.hugepages, w.extended)],
      ]),
    ];
  },
};

const TYPE_NAMES: Record<string, string> = { INIT_CONTAINER: 'init', SIDECAR_CONTAINER: 'sidecar', REGULAR_CONTAINER: 'regular' };

const containers: PlanSection = {
  key: 'containers',
  json: (r) => r.sizing.containers,
  text: (r) => {
    if (r.sizing.containers.length === 0) return [];
    const rows = r.sizing.containers.map((c) => [
      c.name,
      TYPE_NAMES[c.type] ?? c.type,
      cpu(c.cpuRequestMillicores),
      c.cpuLimitMillicores === null ? '-' : cpu(c.cpuLimitMillicores),
      bytes(c.memoryRequestBytes),
      c.memoryLimitBytes === null ? '-' : bytes(c.memoryLimitBytes),
      others(c.hugepages, c.extended),
    ]);
    return ['Containers', ...table([['NAME', 'TYPE', 'CPU REQ', 'CPU LIM', 'MEM REQ', 'MEM LIM', 'OTHER'], ...rows])];
  },
};

const pcie: PlanSection = {
  key: 'pcie',
  json: (r) => ({ ...r.pcie.description, sources: r.pcie.devices.sources, warnings: r.pcie.warnings }),
  text: (r) => ['PCIe', ...r.pcie.text.map((l) => `  ${l}`), ...r.pcie.warnings.map((w) => `  warning: ${w}`)],
};

const network: PlanSection = {
  key: 'network',
  json: (r) => r.network ?? { mode: 'none' },
  text: (r) =>
    r.network === null
      ? ['Network', '  none (network.mode "none"): the VM gets no NIC']
      : [
          'Network (CNI)',
          ...table([
            ['config', r.network.cniConfDir],
            ['namespace', `/run/netns/${r.network.netns}`],
            ['NIC', `virtio-net-pci on ${r.network.slot}, vhost ${r.network.vhost ? 'on' : 'off'}`],
            ['TAP', `${r.network.tapName} in the pod namespace, tc mirred to and from the CNI interface`],
            ['MAC/MTU', `the CNI interface's (${r.network.plannedMac} shown until CNI ADD)`],
          ]),
        ],
};

/** QEMU arguments printed one option per line, values joined to their flag, as a reviewer reads them. */
function argvLines(argv: string[]): string[] {
  const lines: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const next = argv[i + 1];
    if (arg.startsWith('-') && next !== undefined && !next.startsWith('-')) {
      lines.push(`  ${arg} ${next}`);
      i++;
    } else lines.push(`  ${arg}`);
  }
  return lines;
}

const qemu: PlanSection = {
  key: 'qemu',
  json: (r) => r.qemu,
  text: (r) => [`QEMU (${r.qemu.accel.accel}: ${r.qemu.accel.reason})`, `  ${r.qemu.binary}`, ...argvLines(r.qemu.argv)],
};

const vmm: PlanSection = {
  key: 'vmm',
  json: (r) => r.vmm,
  text: (r) => {
    const v = r.vmm;
    const off = (what: string) => `off (${what}): ${v.optOutReason ?? 'no reason given'}`;
    const range = v.identityRange;
    return [
      'VMM confinement',
      ...table([
        ['seccomp', v.seccomp === null ? off('no -sandbox') : `-sandbox ${v.seccomp}`],
        [
          'identity',
          range === null
            ? off('QEMU runs as root with every capability')
            : `uid = gid = the first free of ${range.firstId}-${range.firstId + range.count - 1}, taken at RunPodSandbox (leases in ${v.leaseDir})`,
        ],
        ...(range === null
          ? []
          : [
              ['privileges', 'no capabilities (none permitted, effective, inheritable, ambient or bounding), no_new_privs'],
              ['jail', `chroot ${v.jailDir}: /usr read only, its own /dev, ${v.vmmDir} (its sockets and console), the guest's files`],
            ]),
      ]),
    ];
  },
};

const tee: PlanSection = {
  key: 'tee',
  json: (r) => (r.tee?.kind === 'none' ? undefined : r.tee),
  text: (r) => {
    const t = r.tee;
    if (t === undefined || t.kind === 'none') return [];
    const fw = t.firmware;
    return [
      'TEE',
      ...table([
        ['kind', `${t.kind} (${t.setting === 'auto' ? `auto: ${t.reason}` : t.reason})`],
        ['can start here', t.launchProblem === null ? 'yes' : `no: ${t.launchProblem}`],
        ...(fw === null
          ? []
          : 'ovmfCode' in fw
            ? [['firmware', `${fw.ovmfCode}, vars copied from ${fw.ovmfVarsTemplate} to ${fw.ovmfVarsCopy}`]]
            : [['firmware', fw.bios]]),
        ...(t.tpm === null ? [] : [['swtpm', `state ${t.tpm.stateDir}, control socket ${t.tpm.socketPath}`]]),
        ...(t.initdataPath === null ? [] : [['initdata', `${t.initdataPath} (fw_cfg)`]]),
        ...(t.guestImage == null
          ? []
          : [
              [
                'guest image',
                t.guestImage.verity === null
                  ? `${t.guestImage.path}: NOT verified (no ${t.guestImage.path}.verity.json): pods are refused`
                  : `${t.guestImage.path}, dm-verity root hash ${t.guestImage.verity.rootHash} on the command line`,
              ],
            ]),
      ]),
    ];
  },
};

/** Sections in output order. */
export const PLAN_SECTIONS: PlanSection[] = [summary, vm, host, vmmOverhead, workload, containers, pcie, network, vmm, tee, qemu];

/** The JSON document: identity keys first, then one key per section. */
export function planJson(report: PlanReport): Record<string, unknown> {
  const out: Record<string, unknown> = {
    handler: report.handler,
    source: report.sizing.source,
    pod: report.pod,
    hostCapacity: report.hostCapacity,
  };
  for (const section of PLAN_SECTIONS) {
    const value = section.json(report);
    if (value !== undefined) out[section.key] = value;
  }
  return out;
}

/** The human-readable report: one block per section, blank lines between. */
export function planText(report: PlanReport): string {
  return `${PLAN_SECTIONS.map((s) => s.text(report))
    .filter((lines) => lines.length > 0)
    .map((lines) => lines.join('\n'))
    .join('\n\n')}\n`;
}
