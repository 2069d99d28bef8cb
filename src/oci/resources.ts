/**
 * linux.resources, linux.devices and the OOM score from the CRI's LinuxContainerResources and
 * devices. The CRI sends int64 as decimal strings and "0" (or "") for unset. Pure.
 */
import type { OciContainerInput, OciGuestLayout, OciResourcesInput } from './input.js';
import { fieldError } from './process.js';
import type { OciDeviceRule, OciLinuxDevice, OciResources } from './spec-types.js';

const RES = 'container.linux.resources';

/** A CRI int64 as a JSON-safe number; undefined for unset ("" or "0"). */
function int(text: string | undefined, field: string, allowNegative = false): number | undefined {
  if (text === undefined || text === '' || text === '0') return undefined;
  if (!/^-?\d+$/.test(text)) throw fieldError('OCI_RESOURCE_INVALID', field, `is "${text}", not an integer`);
  const n = Number(text);
  if (!Number.isSafeInteger(n) || (n < 0 && !allowNegative)) {
    throw fieldError('OCI_RESOURCE_INVALID', field, `is ${text}, out of range`);
  }
  return n;
}

/** The OOM score adjustment, passed through as the kubelet computed it (-1000..1000). */
export function resolveOomScoreAdj(resources: OciResourcesInput | null | undefined): number | undefined {
  const n = int(resources?.oom_score_adj, `${RES}.oom_score_adj`, true);
  if (n !== undefined && (n < -1000 || n > 1000))
    throw fieldError('OCI_RESOURCE_INVALID', `${RES}.oom_score_adj`, `is ${n}, outside -1000..1000`);
  return n;
}

/** CPU, memory, swap, hugepage and unified limits; device rules are added by `resolveDevices`. */
export function resolveResources(resources: OciResourcesInput | null | undefined): Omit<OciResources, 'devices'> {
  const out: Omit<OciResources, 'devices'> = {};
  if (resources == null) return out;
  const cpu: NonNullable<OciResources['cpu']> = {};
  const shares = int(resources.cpu_shares, `${RES}.cpu_shares`);
  const quota = int(resources.cpu_quota, `${RES}.cpu_quota`, true);
  const period = int(resources.cpu_period, `${RES}.cpu_period`);
  if (shares !== undefined) cpu.shares = shares;
  if (quota !== undefined) cpu.quota = quota;
  if (period !== undefined) cpu.period = period;
  if ((resources.cpuset_cpus ?? '') !== '') cpu.cpus = resources.cpuset_cpus!;
  if ((resources.cpuset_mems ?? '') !== '') cpu.mems = resources.cpuset_mems!;
  if (Object.keys(cpu).length > 0) out.cpu = cpu;
  const memory: NonNullable<OciResources['memory']> = {};
  const limit = int(resources.memory_limit_in_bytes, `${RES}.memory_limit_in_bytes`);
  const swap = int(resources.memory_swap_limit_in_bytes, `${RES}.memory_swap_limit_in_bytes`, true);
  if (limit !== undefined) memory.limit = limit;
  if (swap !== undefined) memory.swap = swap;
  if (Object.keys(memory).length > 0) out.memory = memory;
  const huge = (resources.hugepage_limits ?? []).map((h, i) => {
    if (!/^\d+[KMG]B$/.test(h.page_size))
      throw fieldError('OCI_RESOURCE_INVALID', `${RES}.hugepage_limits[${i}].page_size`, `is "${h.page_size}", not a size such as 2MB`);
    return { pageSize: h.page_size, limit: int(h.limit, `${RES}.hugepage_limits[${i}].limit`) ?? 0 };
  });
  if (huge.length > 0) out.hugepageLimits = huge;
  const unifiedKeys = Object.keys(resources.unified ?? {}).sort();
  if (unifiedKeys.length > 0) out.unified = Object.fromEntries(unifiedKeys.map((k) => [k, resources.unified![k]!]));
  return out;
}

export interface DevicePlan {
  devices: OciLinuxDevice[];
  rules: OciDeviceRule[];
}

/**
 * Device nodes and the device cgroup. Everything is denied, then each requested device is
 * allowed with its permissions. A privileged container may use every device of the guest: the
 * cgroup allows all, and the guest's device nodes (when the caller lists them) are created.
 */
export function resolveDevices(container: OciContainerInput, guest: OciGuestLayout, privileged: boolean): DevicePlan {
  const devices: OciLinuxDevice[] = [];
  const rules: OciDeviceRule[] = [{ allow: false, access: 'rwm' }];
  (container.devices ?? []).forEach((d, i) => {
    const field = `container.devices[${i}]`;
    const access = d.permissions === undefined || d.permissions === '' ? 'rwm' : d.permissions;
    if (!/^(?!.*(.).*\1)[rwm]{1,3}$/.test(access))
      throw fieldError('OCI_DEVICE_INVALID', `${field}.permissions`, `is "${access}", not a combination of r, w and m`);
    if (!d.container_path.startsWith('/'))
      throw fieldError('OCI_DEVICE_INVALID', `${field}.container_path`, `is "${d.container_path}", not an absolute path`);
    const facts = guest.devices?.[d.container_path];
    if (facts === undefined) throw fieldError('OCI_DEVICE_UNRESOLVED', `${field}.host_path`, 'has no device node in the guest');
    devices.push({ path: d.container_path, ...facts });
    if (facts.type === 'c' || facts.type === 'b')
      rules.push({ allow: true, type: facts.type, major: facts.major, minor: facts.minor, access });
  });
  if (privileged) {
    const requested = new Set(devices.map((d) => d.path));
    for (const d of guest.privilegedDevices ?? []) if (!requested.has(d.path)) devices.push({ ...d });
    return { devices, rules: [{ allow: true, access: 'rwm' }] };
  }
  return { devices, rules };
}
