import type { KataConfig } from './types.js';

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
  return problems;
}
