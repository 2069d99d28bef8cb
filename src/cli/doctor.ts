import { detectCgroupMode, probeSystemdManager } from '../cgroups/index.js';
import { errorMessage } from '../common/errors.js';
import { createLogger } from '../common/logger.js';
import type { KataConfig } from '../config/types.js';
import { probeJailer, probeQemuSandbox, probeSetpriv } from '../hypervisor/confine-probe.js';
import { defaultJailerBinary, QEMU_SECCOMP_SANDBOX } from '../hypervisor/index.js';
import { readRootfsMode } from '../images/overlay-probe.js';
import { NETNS_DIR, networkReadiness } from '../network/index.js';
import { readHostInventory } from '../pcie/index.js';
import { gatherFacts } from '../runtime/gather-facts.js';
import {
  boundNamespace,
  namespaceOf,
  processesInNamespace,
  readNamespaceMountinfo,
  rootMountShared,
  sameNamespace,
} from '../runtime/mount-namespace.js';
import { poolDoctorReport } from '../runtime/pool/doctor.js';
import { auditOrphans, ownersFromRecords } from '../runtime/sandbox/orphan-audit.js';
import { type CliIo, parseCommandArgs, UsageError } from './args.js';
import { containerdChecks } from './doctor-containerd.js';
import { identityRangeCheck } from './doctor-identities.js';
import { teeChecks } from './doctor-tee.js';
import { loadWithOverrides } from './serve.js';

const HELP = `Usage: kata-ts doctor [--config FILE] [--format text|json] [--containerd-config FILE]

Checks this host the way the daemon will use it and prints one line per check with ok, warn or
fail: QEMU binary, acceleration (KVM or TCG, and why), guest kernel and initramfs, the TEEs this
host and its QEMU can start (SEV-SNP needs QEMU 9.1, TDX 10.1) and what each handler's tee.kind
resolves to (its firmware and swtpm present), CNI network,
cgroup mode (v1, v2 or hybrid), the cgroup driver RuntimeConfig will advertise, systemd
reachability, IOMMU groups for VFIO, the runtime's mount namespace, the VMM confinement (QEMU's
seccomp option, setpriv, the identity range, what each handler turns off), and orphans (QEMU,
virtiofsd, mounts in that namespace, cgroups, files no record owns), and the containerd integration
(its version, the kata-ts handlers in its config, default /etc/containerd/config.toml, imports
followed, the shim binaries on its PATH: warnings until a kata-ts handler is configured, failures
after). Exits 1 when any check fails.
`;

export type Verdict = 'ok' | 'warn' | 'fail';
export interface DoctorCheck {
  name: string;
  verdict: Verdict;
  message: string;
}

/** Run every check; never throws for a host problem (that is what the report is for). */
export async function runDoctorChecks(
  config: KataConfig,
  configPath: string | null,
  containerdConfigPath?: string,
): Promise<DoctorCheck[]> {
  const checks: DoctorCheck[] = [];
  checks.push({ name: 'config', verdict: 'ok', message: configPath ?? 'no config file: built-in defaults' });
  const facts = await gatherFacts({ config, path: configPath });
  checks.push({ name: 'qemu', verdict: facts.qemu.ok ? 'ok' : 'fail', message: facts.qemu.message });
  checks.push({
    name: 'acceleration',
    // TCG works everywhere but boots take seconds instead of a fraction of one: worth a warning.
    verdict: facts.acceleration.accel === 'kvm' ? 'ok' : 'warn',
    message: `${facts.acceleration.accel}: ${facts.acceleration.reason}`,
  });
  checks.push({ name: 'guest-assets', verdict: facts.guestAssets.ok ? 'ok' : 'fail', message: facts.guestAssets.message });
  checks.push(...(await teeChecks(config, facts)));

  try {
    const mode = await detectCgroupMode(config.cgroupRoot);
    checks.push({ name: 'cgroup-mode', verdict: 'ok', message: `${mode} (${config.cgroupRoot})` });
  } catch (err) {
    checks.push({ name: 'cgroup-mode', verdict: 'fail', message: errorMessage(err) });
  }
  const driver = facts.cgroupDriver;
  checks.push({
    name: 'cgroup-driver',
    verdict: 'ok',
    message: `${driver.name} (${driver.source === 'config' ? 'set in the config file' : `detected: ${config.systemdRuntimeDir} ${driver.name === 'systemd' ? 'exists' : 'does not exist'}`}); RuntimeConfig advertises the same`,
  });

  checks.push(...(await vmmChecks(config)));

  const quiet = createLogger({ level: 'silent' });
  try {
    const info = await probeSystemdManager(config.dbusAddress, quiet, 3000);
    checks.push({ name: 'systemd', verdict: 'ok', message: `systemd ${info.version} reachable at ${info.address}` });
  } catch (err) {
    // Unreachable systemd only matters when the systemd driver is the one in use.
    checks.push({
      name: 'systemd',
      verdict: driver.name === 'systemd' ? 'fail' : 'warn',
      message: `${errorMessage(err).replace(/\.$/, '')}${driver.name === 'systemd' ? '' : ' (not needed: the cgroupfs driver is in use)'}`,
    });
  }

  // Pods cannot start without it, but the host itself is fine: a warning (the kubelet waits for NetworkReady).
  const network = await networkReadiness(config.network);
  checks.push({
    name: 'network',
    verdict: network.ready ? 'ok' : 'warn',
    message: network.reason === '' ? network.message : `${network.reason}: ${network.message}`,
  });

  try {
    const inventory = await readHostInventory({ sysfsRoot: config.pcie.sysfsRoot, devRoot: config.pcie.devRoot });
    const vfio = inventory.functions.filter((f) => f.driver === 'vfio-pci').length;
    checks.push(
      inventory.iommuEnabled
        ? { name: 'iommu', verdict: 'ok', message: `${inventory.groups.length} IOMMU groups, ${vfio} functions bound to vfio-pci` }
        : {
            name: 'iommu',
            verdict: 'warn',
            message: `no IOMMU groups under ${config.pcie.sysfsRoot}/kernel/iommu_groups: VFIO devices cannot be passed to pods`,
          },
    );
  } catch (err) {
    checks.push({ name: 'iommu', verdict: 'fail', message: errorMessage(err) });
  }
  // Decided by the daemon's own probe at its start (a mount in its namespace), not probed here.
  const rootfs = await readRootfsMode(config.stateDir);
  checks.push(
    rootfs === undefined
      ? { name: 'container-rootfs', verdict: 'ok', message: 'not decided yet: the daemon probes overlayfs at its start' }
      : rootfs.mode === 'overlay'
        ? { name: 'container-rootfs', verdict: 'ok', message: 'overlay of shared image layers' }
        : { name: 'container-rootfs', verdict: 'warn', message: `copies of each image (cp): ${rootfs.reason}` },
  );
  // The daemon's mounts are in the runtime's namespace: the audit reads that mount table.
  let mountinfo: string | undefined;
  try {
    const ns = await mountNamespaceCheck(config);
    checks.push(ns.check);
    mountinfo = ns.mountinfo;
  } catch (err) {
    checks.push({ name: 'mount-namespace', verdict: 'warn', message: errorMessage(err) });
  }
  try {
    const orphans = await auditOrphans(await ownersFromRecords(config.stateDir), {
      stateDir: config.stateDir,
      cgroupRoot: config.cgroupRoot,
      netnsDir: NETNS_DIR,
      ...(mountinfo === undefined ? {} : { mountinfo }),
    });
    checks.push(
      orphans.length === 0
        ? { name: 'orphans', verdict: 'ok', message: `nothing unowned under ${config.stateDir}, in ${NETNS_DIR} or in kata-ts cgroups` }
        : {
            name: 'orphans',
            verdict: 'warn',
            message: `${orphans.length} without a record: ${orphans.map((o) => `${o.kind} ${o.path}${o.pid === undefined ? '' : ` (pid ${o.pid})`}`).join('; ')}`,
          },
    );
  } catch (err) {
    checks.push({ name: 'orphans', verdict: 'warn', message: errorMessage(err) });
  }
  checks.push(...(await containerdChecks(containerdConfigPath === undefined ? {} : { configPath: containerdConfigPath })));
  try {
    checks.push({ name: 'pool', ...(await poolDoctorReport(config, '/proc', driver.name)) });
  } catch (err) {
    checks.push({ name: 'pool', verdict: 'warn', message: errorMessage(err) });
  }
  return checks;
}

/** Where the runtime's mount namespace is and who is in it, and its mount table when this process is outside it. */
async function mountNamespaceCheck(config: KataConfig): Promise<{ check: DoctorCheck; mountinfo?: string }> {
  const name = 'mount-namespace';
  const file = config.mountNamespacePath;
  if (file === null)
    return { check: { name, verdict: 'ok', message: 'mountNamespacePath null: the runtime mounts in the namespace it is started in' } };
  const shared = await rootMountShared();
  const note = shared ? '' : "; the root mount is private here, so mounts the host makes later do not reach the runtime's namespace";
  const id = await boundNamespace(file);
  if (id === undefined) return { check: { name, verdict: shared ? 'ok' : 'warn', message: `${file}: not created yet${note}` } };
  const own = namespaceOf();
  const inside = own !== undefined && sameNamespace(own, id);
  return {
    check: {
      name,
      verdict: shared ? 'ok' : 'warn',
      message: `${file}: mnt:[${id.ino}], ${processesInNamespace(id).length} process(es) in it${note}`,
    },
    ...(inside ? {} : { mountinfo: await readNamespaceMountinfo(file) }),
  };
}

export async function runDoctorCommand(argv: string[], io: CliIo): Promise<number> {
  const { values } = parseCommandArgs(argv, {
    config: { type: 'string' },
    format: { type: 'string', default: 'text' },
    'containerd-config': { type: 'string' },
    help: { type: 'boolean', short: 'h' },
  });
  if (values.help === true) {
    io.stdout.write(HELP);
    return 0;
  }
  if (values.format !== 'text' && values.format !== 'json') throw new UsageError(`--format must be text or json, got "${values.format}"`);
  const loaded = await loadWithOverrides(values);
  const checks = await runDoctorChecks(loaded.config, loaded.path, values['containerd-config']);
  if (values.format === 'json') {
    io.stdout.write(`${JSON.stringify({ checks }, null, 2)}\n`);
  } else {
    const width = Math.max(...checks.map((c) => c.name.length));
    for (const c of checks) io.stdout.write(`${c.verdict.padEnd(4)}  ${c.name.padEnd(width)}  ${c.message}\n`);
  }
  return checks.some((c) => c.verdict === 'fail') ? 1 : 0;
}

/**
 * What this host supports for confined VMMs, and what the handlers ask of it: a failure only
 * where some handler needs the missing piece (an opted-out handler's needs are a warning).
 */
export async function vmmChecks(config: KataConfig): Promise<DoctorCheck[]> {
  const handlers = Object.entries(config.handlers);
  const wantSeccomp = handlers.some(([, h]) => h.vmmConfinement.seccomp);
  const wantUnprivileged = handlers.some(([, h]) => h.vmmConfinement.unprivileged);
  const checks: DoctorCheck[] = [];
  const seccomp = await probeQemuSandbox(config.hypervisor.qemuBinary, QEMU_SECCOMP_SANDBOX);
  checks.push({ name: 'vmm-seccomp', verdict: seccomp.ok ? 'ok' : wantSeccomp ? 'fail' : 'warn', message: seccomp.message });
  const setpriv = await probeSetpriv();
  const jailer = await probeJailer(defaultJailerBinary());
  checks.push({ name: 'vmm-jailer', verdict: jailer.ok ? 'ok' : wantUnprivileged ? 'fail' : 'warn', message: jailer.message });
  checks.push({
    name: 'vmm-identity',
    verdict: !setpriv.ok ? (wantUnprivileged ? 'fail' : 'warn') : 'ok',
    message: setpriv.ok ? `${setpriv.message} drops QEMU's privileges` : setpriv.message,
  });
  checks.push(await identityRangeCheck(config.hypervisor.vmmIdentities));
  const optedOut = handlers.filter(([, h]) => !h.vmmConfinement.seccomp || !h.vmmConfinement.unprivileged);
  const describe = ([name, h]: (typeof handlers)[number]) => {
    const c = h.vmmConfinement;
    const off = [c.seccomp ? null : 'seccomp', c.unprivileged ? null : 'unprivileged'].filter((x) => x !== null);
    return off.length === 0 ? `${name}: seccomp, own uid, no capabilities, jail` : `${name}: ${off.join(' and ')} off (${c.optOutReason})`;
  };
  checks.push({ name: 'vmm-handlers', verdict: optedOut.length > 0 ? 'warn' : 'ok', message: handlers.map(describe).join('; ') });
  return checks;
}
