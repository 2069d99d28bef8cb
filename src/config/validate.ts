import type { CgroupDriverSetting, KataConfig } from './types.js';

/**
 * Cross-field rules that a JSON Schema cannot say well. Pure: returns every problem found, each a
 * sentence starting with the path of the offending key, so an operator fixes them all in one go.
 */
export function crossFieldProblems(config: KataConfig): string[] {
  const problems: string[] = [];
  const names = Object.keys(config.handlers);
  if (names.length === 0) problems.push('/handlers must define at least one handler');
  if (!(config.defaultHandler in config.handlers)) {
    problems.push(`/defaultHandler "${config.defaultHandler}" is not one of the handlers (${names.join(', ')})`);
  }
  const ids = config.hypervisor.vmmIdentities;
  if (ids.firstId + ids.count - 1 > 4_294_967_294) {
    problems.push(`/hypervisor/vmmIdentities firstId ${ids.firstId} + count ${ids.count} runs past the last uid (4294967294)`);
  }
  for (const [name, h] of Object.entries(config.handlers)) {
    const at = `/handlers/${name}`;
    const vm = h.vm;
    if (vm.minMemoryMiB > vm.maxMemoryMiB) {
      problems.push(`${at}/vm/minMemoryMiB ${vm.minMemoryMiB} exceeds maxMemoryMiB ${vm.maxMemoryMiB}`);
    }
    if (vm.defaultMemoryMiB > vm.maxMemoryMiB) {
      problems.push(`${at}/vm/defaultMemoryMiB ${vm.defaultMemoryMiB} exceeds maxMemoryMiB ${vm.maxMemoryMiB}`);
    }
    if (vm.defaultVcpus > vm.maxVcpus) {
      problems.push(`${at}/vm/defaultVcpus ${vm.defaultVcpus} exceeds maxVcpus ${vm.maxVcpus}`);
    }
    const c = h.vmmConfinement;
    if ((!c.seccomp || !c.unprivileged) && (c.optOutReason === null || c.optOutReason.trim() === '')) {
      const off = [c.seccomp ? null : 'seccomp', c.unprivileged ? null : 'unprivileged'].filter((x) => x !== null).join(' and ');
      problems.push(`${at}/vmmConfinement/optOutReason must say why ${off} is turned off`);
    }
    if (h.tee.kind !== 'none' && !h.confidential) {
      problems.push(
        `${at}/tee/kind "${h.tee.kind}" needs a confidential handler (confidential: true): a TEE guest is never resized or hot-plugged`,
      );
    }
    if (h.confidential) {
      if (vm.hotplugVcpus !== 0 || vm.hotplugMemoryMiB !== 0) {
        problems.push(`${at}/vm/hotplugVcpus and hotplugMemoryMiB must be 0 for a confidential handler, which is never resized`);
      }
      if (h.pcie.vfioPolicy !== 'cold-plug') {
        problems.push(`${at}/pcie/vfioPolicy must be "cold-plug" for a confidential handler, which is never reconfigured`);
      }
      if (h.pcie.sparePorts !== 0) {
        problems.push(`${at}/pcie/sparePorts must be 0 for a confidential handler, which never hot-plugs`);
      }
      if (vm.freePageReporting) {
        problems.push(
          `${at}/vm/freePageReporting must be false for a confidential handler: the host would discard pages private to the guest`,
        );
      }
    }
  }
  for (const [name, size] of Object.entries(config.pool.sizes)) {
    if (size === 0) continue;
    const h = config.handlers[name];
    if (h === undefined) problems.push(`/pool/sizes/${name} names no handler (${names.join(', ')})`);
    else if (h.confidential) problems.push(`/pool/sizes/${name} must be 0: a confidential handler's VM is never pooled`);
  }
  problems.push(...templateProblems(config, names));
  const poolParent = config.pool.cgroupParent;
  if (poolParent !== null) {
    const problem = poolCgroupParentProblem(poolParent, config.cgroupDriver);
    if (problem !== null) problems.push(`/pool/cgroupParent "${poolParent}" ${problem}`);
  }
  return problems;
}

// A cgroupfs path component: printable, no '/', not a dot entry, not an interface file's name.
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what this refuses.
const CGROUPFS_COMPONENT = /^[^/\s\x00-\x1f\x7f]{1,255}$/;
/** A slice systemd can make below its root slice: letters, digits, ":_.\\", no "-" (which would nest it). */
const POOL_SLICE = /^[A-Za-z0-9:_.\\]{1,249}\.slice$/;

/**
 * Why `parent` cannot be the pool's cgroup (the rest of the sentence), or null. It must name a
 * level of its own (not the root) in the style of the driver (`auto`: the style it looks like;
 * the daemon checks it again against the driver it detects): a cgroupfs path of usable
 * components, or a bare systemd slice without "-" (a top-level slice, whose weight is kata-ts's).
 */
export function poolCgroupParentProblem(parent: string, driver: CgroupDriverSetting): string | null {
  const systemdStyle = parent.endsWith('.slice');
  if (driver === 'systemd' && !systemdStyle)
    return 'is a cgroupfs path but cgroupDriver is systemd, which takes a slice such as "kata_ts_pool.slice"';
  if (driver === 'cgroupfs' && systemdStyle)
    return 'is a systemd slice but cgroupDriver is cgroupfs, which takes a path such as "/kata-ts-pool"';
  if (systemdStyle) {
    if (!POOL_SLICE.test(parent) || parent === '.slice')
      return 'must be a slice name of letters, digits and ":_.\\" ending in ".slice", with no "-" (which would nest it in another slice) and no "/"';
    return null;
  }
  if (!parent.startsWith('/')) return 'must be an absolute cgroupfs path such as "/kata-ts-pool"';
  const components = parent.split('/').filter((c) => c !== '');
  if (components.length === 0) return 'must name a cgroup of its own, not the root';
  for (const c of components) {
    if (c === '.' || c === '..' || !CGROUPFS_COMPONENT.test(c) || c.startsWith('cgroup.'))
      return `has an unusable path component "${c}" (dot entries, blanks, control characters and cgroup interface file names are not allowed)`;
  }
  return null;
}

/**
 * What is wrong with `templates` (one sentence each, naming the field): an unknown handler, a
 * confidential one (a clone would share measured memory and secrets that were released to one
 * launched VM), a confined one (QEMU 7.2 opens the RAM file every clone maps for writing, so a
 * confined clone would need it writable by its identity: one compromised clone could write its
 * siblings' memory), a root that is not an absolute path QEMU can take.
 */
function templateProblems(config: KataConfig, names: readonly string[]): string[] {
  const problems: string[] = [];
  for (const [i, name] of config.templates.handlers.entries()) {
    const h = config.handlers[name];
    const at = `/templates/handlers/${i}`;
    if (h === undefined) problems.push(`${at} "${name}" names no handler (${names.join(', ')})`);
    else if (h.confidential) problems.push(`${at} "${name}" is a confidential handler, whose VMs are never cloned`);
    else if (h.vmmConfinement.unprivileged) {
      problems.push(
        `${at} "${name}" runs QEMU confined: clones need /handlers/${name}/vmmConfinement/unprivileged false (QEMU 7.2 opens the template's RAM file for writing)`,
      );
    }
  }
  const { root } = config.templates;
  if (!root.startsWith('/') || root.includes(',') || root.split('/').includes('..')) {
    problems.push(`/templates/root "${root}" must be an absolute path without a comma or a ".." component`);
  }
  return problems;
}
