/**
 * The real containerd with its CRI plugin, started privately for a test: the harness kata-ts's
 * shim (`io.containerd.kata-ts.v2`) runs under, beside runc. Debian 12's 1.6.20 from PATH by
 * default; `release` runs another (trixie's 1.7, sid's 2.x, fetched by
 * test/helpers/containerd-releases.ts) with its own runc shim and the config schema it reads
 * (version 2 for 1.x, version 3 for 2.x: containerdConfigToml).
 *
 * Everything it makes is the test's own and goes away in stop(), also when the test fails:
 *
 * - a temporary directory with containerd's root, state, temp dir, both sockets, config.toml,
 *   runc's root, the CNI config and host-local's allocations, and the registry's
 *   hosts.toml; nothing is written to /etc/containerd, /etc/cni, /opt or /var/lib/containerd;
 * - a private cgroup tree (`kata-ts-test-*` below this process's own cgroup in every hierarchy,
 *   test/helpers/cgroups-private.ts), which is the ROOT of the cgroup namespace containerd lives in:
 *   inside, /sys/fs/cgroup is mounted again from there, so a pod's `cgroup_parent` is an ordinary
 *   absolute path (`/kubepods/besteffort/pod<uid>`, or containerd's default `/k8s.io/<id>` when
 *   empty) and every cgroup runc (or a shim) creates lies inside the private tree. The holder of
 *   the namespaces sits in `<private>/node`, containerd (and so every shim it starts) in
 *   `<private>/containerd`; pods wherever their cgroup_parent says, below the private root;
 * - a "node": new network, mount and cgroup namespaces (test/harness/containerd/node.sh) held by
 *   a sleeping process. containerd runs in them (nsenter), so the CNI bridge is made there and
 *   never on the host; the pods' network namespaces are bind-mounted under containerd's state dir
 *   (`netns_mounts_under_state_dir`); /run and /var/lib are overlays whose upper layers lie in the
 *   temporary directory, so /run/containerd/s (the shim sockets, a fixed path in 1.6) and libcni's
 *   cache stay private while containerd and its shims share them. The mount namespace is private
 *   (no propagation either way): its mounts (overlay rootfs, shm, netns) never reach the host and
 *   vanish with its last process. Processes containerd starts (shims, and QEMU through kata-ts's
 *   shim) inherit all of this;
 * - a relay making the loopback registry's 127.0.0.1:<port> answer inside the node (the registry
 *   itself stays on the host's loopback), and, unless the caller brings a registry, that registry.
 *
 * restart() kills containerd only (SIGTERM, then SIGKILL, by pid) and starts it again on the same
 * root and state, in the same namespaces: pods and their shims keep running, as on a node whose
 * containerd is upgraded. vitest-free, so that benches can use it.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { type Dirent, existsSync, promises as fsp, readdirSync, readFileSync, readlinkSync, rmdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { type CgroupMount, parseProcCgroup } from '../../src/cgroups/procfs.js';
import { packageRoot } from '../../src/common/paths.js';
import type { ContainerdVersion } from '../../src/install/version.js';
import { createPrivateCgroups, mkdirEverywhere, type PrivateCgroups, removePrivateCgroups, treeDeepestFirst } from './cgroups-private.js';
import type { ContainerdRelease } from './containerd-releases.js';
import { criClient } from './cri-client.js';
import { buildImage, busyboxBaseEntries, RegistryPusher } from './images-builder.js';
import { REGISTRY_BINARY, type RegistryHandle, startRegistry } from './images-registry.js';
import { type LoopbackRelay, startLoopbackRelay } from './loopback-relay.js';
import { DEBIAN_CNI_BIN_DIR } from './network-node.js';
import { until } from './poll.js';
import { scaledMs } from './time-scale.js';

const execFileAsync = promisify(execFile);

/** The containerd namespace its CRI plugin keeps everything in. */
export const CONTAINERD_NAMESPACE = 'k8s.io';
/** The RuntimeClass handler the config names for kata-ts's shim. */
export const KATA_TS_HANDLER = 'kata-ts';
/** containerd turns this into the binary name `containerd-shim-kata-ts-v2`, looked up on its PATH. */
export const KATA_TS_RUNTIME_TYPE = 'io.containerd.kata-ts.v2';
/**
 * The annotations containerd passes through to kata-ts's shim in the OCI config.json: Kata's own
 * prefix (for pods written for Kata) and kata-ts's (`kata-ts.dev/container-type`, ...). containerd
 * adds its own `io.kubernetes.cri.*` ones (sandbox id, sizing) regardless.
 */
export const KATA_TS_ANNOTATIONS = ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*'];

const HARNESS_DIR = path.join(packageRoot(), 'test', 'harness', 'containerd');
/** Below the private root: where the namespaces' holder and containerd (with its shims) live. */
const NODE_CGROUP = 'node';
const DAEMON_CGROUP = 'containerd';
const CNI_NETWORK = 'kata-ts-containerd';
const CNI_BRIDGE = 'kts-cni0';

export interface ContainerdOptions {
  /**
   * The loopback registry images are pulled from (plain HTTP, through containerd's hosts.toml).
   * Without one, the harness starts its own and stops it in stop().
   */
  registry?: RegistryHandle;
  /**
   * containerd's `sandbox_image` (pulled from `registry`). Default: a busybox image running
   * `sleep infinity`, built and pushed by the harness.
   */
  sandboxImage?: string;
  /** Prepended to containerd's PATH: where `containerd-shim-kata-ts-v2` is found. */
  shimBinDir?: string;
  /** More environment for containerd, which its shims inherit (PATH is the harness's). */
  env?: Record<string, string>;
  /** containerd's log level (default info). */
  logLevel?: 'debug' | 'info' | 'warn';
  /** TOML appended to config.toml as it is (e.g. `[plugins."...".runtimes.kata-ts.options]`). */
  extraToml?: string;
  /** false: config.toml names no kata-ts handler (a test installs it, e.g. with `kata-ts install`). Default true. */
  kataHandler?: boolean;
  /** containerd 2.x only: the kata-ts handler as an introspectable one (ContainerdConfigParams.kataShimPath). */
  kataShimPath?: string;
  /**
   * Registry domains (e.g. `registry.k8s.io`) whose hosts.toml mirrors them to `registry` over
   * plain HTTP, so images keep their upstream names (critest's stand-ins). Default: none.
   */
  mirrorDomains?: string[];
  /** Add the portmap plugin (host ports, as a kubelet node's CNI has it) to the CNI network. Default false. */
  cniPortmap?: boolean;
  /**
   * The containerd to run (test/helpers/containerd-releases.ts): its binary, its runc shim's
   * directory before the system's on PATH, and the config schema its version reads (version 2 for
   * 1.x, version 3 for 2.x). Default: the containerd on PATH, taken as Debian 12's 1.6.
   */
  release?: ContainerdRelease;
  /**
   * config.toml's top-level `imports` (paths or globs, relative to the config's directory), as a
   * node whose packages drop files into `conf.d` has them. Default: none.
   */
  imports?: string[];
  /**
   * The config schema to write: by default the release's own (2 for 1.x, 3 for 2.x); 2 under a 2.x
   * release is a version 2 file as Debian's 2.x package ships one, which containerd migrates.
   */
  configSchema?: 2 | 3;
  /**
   * true: the node's root mount stays private, as on a host without systemd (node.sh skips its
   * `mount --make-rshared /`): mounts containerd makes after kata-ts's runtime mount namespace
   * exists (the pods' network namespaces) do not reach that namespace. Default false (shared, as
   * systemd makes a node's mounts).
   */
  privateRoot?: boolean;
}

/** What stop() found and did. */
export interface ContainerdStopReport {
  /** The containerd process that was stopped (by pid), and whether SIGTERM sufficed. */
  containerd: { pid: number; signal: 'SIGTERM' | 'SIGKILL' } | null;
  /**
   * Processes still in the private cgroup tree when containerd had gone, other than the holder
   * (a shim, a container): `pid comm cgroup`. Killed by pid; after an orderly teardown there are none.
   */
  strays: string[];
  /** Anything left after the cleanup (a mount, a cgroup, a process in the node's namespaces, the directory). */
  leftovers: string[];
}

export interface ContainerdHandle {
  /** containerd's gRPC socket, which serves the CRI. */
  criSocket: string;
  /** containerd's gRPC socket (GRPC_ADDRESS and `-address` for shims; the same socket as criSocket). */
  grpcAddress: string;
  /** containerd's ttrpc socket (TTRPC_ADDRESS for shims). */
  ttrpcAddress: string;
  dir: string;
  namespace: typeof CONTAINERD_NAMESPACE;
  /** The release running (the system's 1.6 unless `release` said otherwise). */
  version: ContainerdVersion;
  configPath: string;
  rootDir: string;
  stateDir: string;
  cniConfDir: string;
  /** host-local's dataDir: `<ipamDir>/<network>/<ip>` per allocation. */
  ipamDir: string;
  /** The pods' IPv4 subnet (a /24 chosen per run, routed only inside the node). */
  podSubnet: string;
  /** `<prefix>.` of podSubnet, e.g. `10.88.17.` */
  podSubnetPrefix: string;
  /** Where containerd bind-mounts the pods' network namespaces. */
  netnsDir: string;
  registry: RegistryHandle;
  sandboxImage: string;
  /** The private cgroup tree: the root of containerd's cgroup namespace (host paths in `hierarchies[].dir`). */
  cgroups: PrivateCgroups;
  /** Host paths of `rel` (an absolute path as containerd sees it, e.g. a cgroup_parent) in every hierarchy. */
  cgroupDirs(rel: string): string[];
  /** The current containerd's pid (changes with restart()). */
  readonly pid: number;
  /** The pid of the process holding the node's namespaces. */
  nodePid: number;
  /** The bundle containerd's runtime v2 makes for a task (config.json, rootfs, the shim's address). */
  bundleDir(id: string): string;
  /** Runs a command in the node's network and mount namespaces; its stdout. */
  nodeExec(argv: string[], timeoutMs?: number): Promise<string>;
  /** Mount points in the node's mount namespace at or below `prefix` (default: the directory). */
  mountsUnder(prefix?: string): Promise<string[]>;
  /** `pid comm cgroup (command line)` of every process in the private tree other than the holder and containerd. */
  strayProcesses(): Promise<string[]>;
  /** Cgroup directories in the private tree (paths as containerd sees them) other than the holder's and containerd's. */
  podCgroups(): Promise<string[]>;
  /** containerd's output so far (all of its runs). */
  logText(): string;
  /** Kill containerd only (SIGTERM, then SIGKILL by pid) and start it again on the same root and state. */
  restart(): Promise<void>;
  /** Stops everything and removes everything (idempotent: later calls answer the first report). */
  stop(): Promise<ContainerdStopReport>;
}

/**
 * containerd's PATH without the directories that hold a kata-ts shim installed on this machine
 * (scripts/setup.sh links one into /usr/local/bin): containerd finds only the shim a test puts in
 * `shimBinDir`, which runs with the test's config, never the machine's.
 */
export function containerdBasePath(pathValue = process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin'): string {
  return pathValue
    .split(path.delimiter)
    .filter((d) => d !== '' && !KATA_TS_SHIM_NAMES.some((name) => existsSync(path.join(d, name))))
    .join(path.delimiter);
}

/** The names an installed kata-ts shim has (scripts/setup.sh). */
const KATA_TS_SHIM_NAMES = ['containerd-shim-kata-ts-v2', 'containerd-shim-kata-ts-cvm-v2'];

/**
 * Why this machine cannot run the harness (a sentence), or null when it can. With `release`, its
 * containerd and runc shim come from there (the release helper checked them) instead of PATH.
 */
export function containerdMissing(release?: ContainerdRelease): string | null {
  if (process.getuid?.() !== 0) return 'not root';
  const fromPath = release?.binDir == null ? ['containerd', 'containerd-shim-runc-v2'] : [];
  for (const bin of [...fromPath, 'runc', 'unshare', 'nsenter', 'ip']) {
    if (!onPath(bin)) return `${bin} is not installed (scripts/setup.sh installs it)`;
  }
  if (!existsSync(REGISTRY_BINARY)) return `${REGISTRY_BINARY} is not installed (scripts/setup.sh installs it)`;
  for (const plugin of ['bridge', 'host-local', 'loopback']) {
    if (!existsSync(path.join(DEBIAN_CNI_BIN_DIR, plugin))) return `the CNI plugin ${plugin} is not in ${DEBIAN_CNI_BIN_DIR}`;
  }
  return null;
}

function onPath(bin: string): boolean {
  return (process.env.PATH ?? '').split(path.delimiter).some((d) => d !== '' && existsSync(path.join(d, bin)));
}

/** A busybox image whose only job is to hold the pod's namespaces, like registry.k8s.io/pause. */
export async function pushPauseImage(registry: RegistryHandle, repo = 'kata-ts/pause', tag = 'busybox-sleep'): Promise<string> {
  const built = await buildImage({
    layers: [{ entries: [...busyboxBaseEntries(), { name: 'bin/sleep', type: 'symlink', linkname: 'busybox' }], compression: 'gzip' }],
    cmd: ['/bin/sleep', 'infinity'],
    label: 'pause',
  });
  await new RegistryPusher(registry.url).pushImage(repo, tag, built);
  return `${registry.host}/${repo}:${tag}`;
}

/** How to mount a hierarchy again inside the namespaces: `-o` options, or '-' for none (cgroup2). */
function mountOptions(m: CgroupMount): string {
  if (m.fsType === 'cgroup2') return '-';
  const named = m.controllers.filter((c) => c.startsWith('name='));
  const real = m.controllers.filter((c) => !c.startsWith('name='));
  return real.length > 0 ? [...real, ...named].join(',') : ['none', ...named].join(',');
}

const toml = (s: string): string => JSON.stringify(s);
const tomlList = (xs: string[]): string => `[${xs.map(toml).join(', ')}]`;

/** Debian 12's containerd, what the harness runs when no release is given. */
export const SYSTEM_CONTAINERD_VERSION: ContainerdVersion = { major: 1, minor: 6, patch: 20 };

/** What config.toml is written from. */
export interface ContainerdConfigParams {
  dir: string;
  sandboxImage: string;
  logLevel: string;
  extraToml?: string;
  kataHandler?: boolean;
  /**
   * containerd 2.x only: write the kata-ts handler with `runtime_type = "io.containerd.runc.v2"`
   * and `runtime_path` = this shim binary, so that containerd 2.1 (which asks only runc-typed
   * handlers for their features) runs the shim's `-info` and learns its OCI features (rro); the
   * shim is the same binary either way. Unset: `io.containerd.kata-ts.v2`, as installs write it.
   */
  kataShimPath?: string;
  /** The release that reads it: 1.x gets version 2, 2.x version 3. Default: 1.6. */
  version?: ContainerdVersion;
  /** Top-level `imports` (written before any table, as TOML needs). */
  imports?: string[];
  /** The schema to write instead of the release's own (2 for 1.x, 3 for 2.x). */
  schema?: 2 | 3;
}

/** config.toml for a private containerd in `dir`, in the schema its release reads. */
export function containerdConfigToml(p: ContainerdConfigParams): string {
  const schema = p.schema ?? ((p.version ?? SYSTEM_CONTAINERD_VERSION).major >= 2 ? 3 : 2);
  return schema === 3 ? containerdConfigTomlV3(p) : containerdConfigTomlV2(p);
}

/**
 * Version 2 (containerd 1.6 and 1.7): the CRI plugin is one section, `io.containerd.grpc.v1.cri`.
 * 1.7 reads 1.6's file as it is; what it adds (NRI, the transfer service, CDI, `sandbox_mode`)
 * keeps its defaults, and NRI is disabled there by default.
 */
function containerdConfigTomlV2(p: ContainerdConfigParams): string {
  const { dir } = p;
  const cri = 'plugins."io.containerd.grpc.v1.cri"';
  return [
    'version = 2',
    ...(p.imports === undefined ? [] : [`imports = ${tomlList(p.imports)}`]),
    `root = ${toml(path.join(dir, 'root'))}`,
    `state = ${toml(path.join(dir, 'state'))}`,
    `temp = ${toml(path.join(dir, 'tmp'))}`,
    'plugin_dir = ""',
    'oom_score = 0',
    // Plugins that would touch the host or that nothing here needs: /opt/containerd, the cgroups
    // monitor (OOM events of the v1 runtime), the restart monitor, tracing, and snapshotters
    // other than overlayfs. The legacy v1 runtime stays: 1.6's tasks service (and so the CRI)
    // refuses to load without it; it only makes directories under root and state.
    'disabled_plugins = [',
    ...[
      'io.containerd.internal.v1.opt',
      'io.containerd.internal.v1.restart',
      'io.containerd.internal.v1.tracing',
      'io.containerd.tracing.processor.v1.otlp',
      'io.containerd.monitor.v1.cgroups',
      'io.containerd.snapshotter.v1.aufs',
      'io.containerd.snapshotter.v1.btrfs',
      'io.containerd.snapshotter.v1.devmapper',
      'io.containerd.snapshotter.v1.zfs',
    ].map((x) => `  ${toml(x)},`),
    ']',
    '',
    '[grpc]',
    `  address = ${toml(path.join(dir, 'containerd.sock'))}`,
    '[ttrpc]',
    `  address = ${toml(path.join(dir, 'containerd.sock.ttrpc'))}`,
    '[debug]',
    '  address = ""',
    `  level = ${toml(p.logLevel)}`,
    '[metrics]',
    '  address = ""',
    '[cgroup]',
    '  path = ""',
    '',
    `[${cri}]`,
    `  sandbox_image = ${toml(p.sandboxImage)}`,
    // No CAP_SYS_RESOURCE in the bounding set on these machines: the pause container's -998 and
    // any adjustment below containerd's own would be refused by the kernel.
    '  restrict_oom_score_adj = true',
    '  disable_apparmor = true',
    '  enable_selinux = false',
    '  netns_mounts_under_state_dir = true',
    '  disable_tcp_service = true',
    '  stream_server_address = "127.0.0.1"',
    '  stream_server_port = "0"',
    '  enable_unprivileged_ports = false',
    '  enable_unprivileged_icmp = false',
    '  tolerate_missing_hugetlb_controller = true',
    '  disable_hugetlb_controller = true',
    '  stats_collect_period = 2',
    `  [${cri}.cni]`,
    `    bin_dir = ${toml(DEBIAN_CNI_BIN_DIR)}`,
    `    conf_dir = ${toml(path.join(dir, 'net.d'))}`,
    '    max_conf_num = 1',
    `  [${cri}.containerd]`,
    '    snapshotter = "overlayfs"',
    '    default_runtime_name = "runc"',
    `    [${cri}.containerd.runtimes.runc]`,
    '      runtime_type = "io.containerd.runc.v2"',
    `      [${cri}.containerd.runtimes.runc.options]`,
    `        Root = ${toml(path.join(dir, 'runc'))}`,
    '        SystemdCgroup = false',
    ...(p.kataHandler === false
      ? []
      : [
          `    [${cri}.containerd.runtimes.${KATA_TS_HANDLER}]`,
          `      runtime_type = ${toml(KATA_TS_RUNTIME_TYPE)}`,
          `      pod_annotations = ${tomlList(KATA_TS_ANNOTATIONS)}`,
          `      container_annotations = ${tomlList(KATA_TS_ANNOTATIONS)}`,
          // A VM gets no host device by being privileged (Kata's recommended setting).
          '      privileged_without_host_devices = true',
        ]),
    `  [${cri}.registry]`,
    `    config_path = ${toml(path.join(dir, 'certs.d'))}`,
    '',
    p.extraToml ?? '',
    '',
  ].join('\n');
}

/**
 * Version 3 (containerd 2.x): the CRI plugin is split. `io.containerd.cri.v1.images` holds the
 * snapshotter, the sandbox ("pause") image under `pinned_images.sandbox` and the registry hosts
 * dir; `io.containerd.cri.v1.runtime` the runtimes (each naming its `sandboxer`: `podsandbox`,
 * the pause container, is what kata-ts's shim serves), CNI (`bin_dirs`, a list) and the
 * container settings; `io.containerd.grpc.v1.cri` only the CRI service and its streaming server.
 * Pulls go through the transfer service, which reads its own `config_path`. Plugins 1.6's file
 * disables are renamed in 2.x (the task monitor, the restart monitor); NRI is on by default and
 * is turned off here (its socket would be a host path).
 */
function containerdConfigTomlV3(p: ContainerdConfigParams): string {
  const { dir } = p;
  const images = "plugins.'io.containerd.cri.v1.images'";
  const runtime = "plugins.'io.containerd.cri.v1.runtime'";
  const certs = toml(path.join(dir, 'certs.d'));
  return [
    'version = 3',
    ...(p.imports === undefined ? [] : [`imports = ${tomlList(p.imports)}`]),
    `root = ${toml(path.join(dir, 'root'))}`,
    `state = ${toml(path.join(dir, 'state'))}`,
    `temp = ${toml(path.join(dir, 'tmp'))}`,
    'oom_score = 0',
    'disabled_plugins = [',
    ...[
      'io.containerd.internal.v1.opt',
      'io.containerd.internal.v1.tracing',
      'io.containerd.tracing.processor.v1.otlp',
      'io.containerd.monitor.container.v1.restart',
      'io.containerd.monitor.task.v1.cgroups',
      'io.containerd.snapshotter.v1.blockfile',
      'io.containerd.snapshotter.v1.btrfs',
      'io.containerd.snapshotter.v1.devmapper',
      'io.containerd.snapshotter.v1.erofs',
      'io.containerd.snapshotter.v1.zfs',
    ].map((x) => `  ${toml(x)},`),
    ']',
    '',
    '[grpc]',
    `  address = ${toml(path.join(dir, 'containerd.sock'))}`,
    '[ttrpc]',
    `  address = ${toml(path.join(dir, 'containerd.sock.ttrpc'))}`,
    '[debug]',
    '  address = ""',
    `  level = ${toml(p.logLevel)}`,
    '[metrics]',
    '  address = ""',
    '[cgroup]',
    '  path = ""',
    '',
    `[${images}]`,
    '  snapshotter = "overlayfs"',
    '  stats_collect_period = 2',
    `  [${images}.pinned_images]`,
    `    sandbox = ${toml(p.sandboxImage)}`,
    `  [${images}.registry]`,
    `    config_path = ${certs}`,
    '',
    `[${runtime}]`,
    // No CAP_SYS_RESOURCE in the bounding set here (see the version 2 file).
    '  restrict_oom_score_adj = true',
    '  disable_apparmor = true',
    '  enable_selinux = false',
    '  netns_mounts_under_state_dir = true',
    '  enable_unprivileged_ports = false',
    '  enable_unprivileged_icmp = false',
    '  tolerate_missing_hugetlb_controller = true',
    '  disable_hugetlb_controller = true',
    '  enable_cdi = false',
    `  [${runtime}.cni]`,
    `    bin_dirs = ${tomlList([DEBIAN_CNI_BIN_DIR])}`,
    `    conf_dir = ${toml(path.join(dir, 'net.d'))}`,
    '    max_conf_num = 1',
    `  [${runtime}.containerd]`,
    '    default_runtime_name = "runc"',
    `    [${runtime}.containerd.runtimes.runc]`,
    '      runtime_type = "io.containerd.runc.v2"',
    '      sandboxer = "podsandbox"',
    `      [${runtime}.containerd.runtimes.runc.options]`,
    `        Root = ${toml(path.join(dir, 'runc'))}`,
    '        SystemdCgroup = false',
    ...(p.kataHandler === false
      ? []
      : [
          `    [${runtime}.containerd.runtimes.${KATA_TS_HANDLER}]`,
          ...(p.kataShimPath === undefined
            ? [`      runtime_type = ${toml(KATA_TS_RUNTIME_TYPE)}`]
            : ['      runtime_type = "io.containerd.runc.v2"', `      runtime_path = ${toml(p.kataShimPath)}`]),
          '      sandboxer = "podsandbox"',
          `      pod_annotations = ${tomlList(KATA_TS_ANNOTATIONS)}`,
          `      container_annotations = ${tomlList(KATA_TS_ANNOTATIONS)}`,
          '      privileged_without_host_devices = true',
        ]),
    '',
    "[plugins.'io.containerd.grpc.v1.cri']",
    '  disable_tcp_service = true',
    '  stream_server_address = "127.0.0.1"',
    '  stream_server_port = "0"',
    '',
    "[plugins.'io.containerd.transfer.v1.local']",
    `  config_path = ${certs}`,
    '',
    // The transfer service (and so the CRI) does not load without its image verifier: kept, on an empty dir of ours.
    "[plugins.'io.containerd.image-verifier.v1.bindir']",
    `  bin_dir = ${toml(path.join(dir, 'image-verifier'))}`,
    '',
    "[plugins.'io.containerd.nri.v1.nri']",
    '  disable = true',
    `  socket_path = ${toml(path.join(dir, 'nri.sock'))}`,
    '',
    p.extraToml ?? '',
    '',
  ].join('\n');
}

/** A bridge + host-local conflist on `subnet` (containerd adds the loopback network itself). */
function cniConflist(dir: string, prefix: string, portmap = false): string {
  return JSON.stringify(
    {
      cniVersion: '1.0.0',
      name: CNI_NETWORK,
      plugins: [
        {
          type: 'bridge',
          bridge: CNI_BRIDGE,
          isGateway: true,
          ipMasq: false,
          hairpinMode: true,
          ipam: {
            type: 'host-local',
            dataDir: path.join(dir, 'ipam'),
            ranges: [[{ subnet: `${prefix}0/24`, gateway: `${prefix}1` }]],
            routes: [{ dst: '0.0.0.0/0' }],
          },
        },
        ...(portmap ? [{ type: 'portmap', capabilities: { portMappings: true } }] : []),
      ],
    },
    null,
    2,
  );
}

/** hosts.toml sending pulls of `server` (a registry's URL) to `mirrorUrl` (plain HTTP). */
export function mirrorHostsToml(server: string, mirrorUrl: string): string {
  return [`server = ${toml(server)}`, '', `[host.${toml(mirrorUrl)}]`, '  capabilities = ["pull", "resolve"]', ''].join('\n');
}

/** Starts a private containerd (see the file's comment); stop() the handle when done. */
export async function startContainerd(options: ContainerdOptions = {}): Promise<ContainerdHandle> {
  const missing = containerdMissing(options.release);
  if (missing !== null) throw new Error(`cannot start containerd: ${missing}`);
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-ts-containerd-'));
  const harness = new PrivateContainerd(dir, options);
  try {
    await harness.start();
  } catch (err) {
    const log = harness.logText();
    const nodeLog = harness.nodeLog();
    const report = await harness.stop();
    throw new Error(
      `${(err as Error).message}\n--- containerd log (warnings and errors)\n${problems(log)}\n--- node log\n${nodeLog}` +
        (report.leftovers.length > 0 ? `\n--- left after cleanup\n${report.leftovers.join('\n')}` : ''),
      { cause: err },
    );
  }
  return harness;
}

/** The warning and error lines of containerd's log (the last 30). */
function problems(log: string): string {
  return tail(
    log
      .split('\n')
      .filter((l) => /level=(warning|error|fatal)/.test(l))
      .join('\n'),
    30,
  );
}

function tail(text: string, lines: number): string {
  return text.split('\n').slice(-lines).join('\n');
}

async function readProcs(dir: string): Promise<number[]> {
  const text = await fsp.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map(Number);
}

function nsInode(pid: number, ns: 'mnt' | 'net' | 'cgroup'): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/${ns}`);
  } catch {
    return undefined;
  }
}

class PrivateContainerd implements ContainerdHandle {
  readonly namespace = CONTAINERD_NAMESPACE;
  readonly version: ContainerdVersion;
  readonly criSocket: string;
  readonly grpcAddress: string;
  readonly ttrpcAddress: string;
  readonly configPath: string;
  readonly rootDir: string;
  readonly stateDir: string;
  readonly cniConfDir: string;
  readonly ipamDir: string;
  readonly netnsDir: string;
  readonly podSubnet: string;
  readonly podSubnetPrefix: string;
  registry!: RegistryHandle;
  sandboxImage = '';
  cgroups: PrivateCgroups = { name: '', hierarchies: [] };
  nodePid = 0;

  private ownRegistry = false;
  private node: ChildProcess | undefined;
  private daemon: ChildProcess | undefined;
  private relay: LoopbackRelay | undefined;
  private nodeNamespaces: { mnt?: string; net?: string } = {};
  private stopped: Promise<ContainerdStopReport> | undefined;
  private readonly emergency = (): void => this.killAllNow();

  constructor(
    readonly dir: string,
    private readonly options: ContainerdOptions,
  ) {
    this.version = options.release?.version ?? SYSTEM_CONTAINERD_VERSION;
    this.criSocket = path.join(dir, 'containerd.sock');
    this.grpcAddress = this.criSocket;
    this.ttrpcAddress = path.join(dir, 'containerd.sock.ttrpc');
    this.configPath = path.join(dir, 'config.toml');
    this.rootDir = path.join(dir, 'root');
    this.stateDir = path.join(dir, 'state');
    this.cniConfDir = path.join(dir, 'net.d');
    this.ipamDir = path.join(dir, 'ipam');
    this.netnsDir = path.join(this.stateDir, 'io.containerd.grpc.v1.cri', 'netns');
    this.podSubnetPrefix = `10.88.${randomBytes(1)[0]}.`;
    this.podSubnet = `${this.podSubnetPrefix}0/24`;
  }

  get pid(): number {
    return this.daemon?.pid ?? 0;
  }

  async start(): Promise<void> {
    // Should this process die without stop(), nothing of ours keeps running.
    process.once('exit', this.emergency);
    if (this.options.registry === undefined) {
      this.registry = await startRegistry();
      this.ownRegistry = true;
    } else {
      this.registry = this.options.registry;
    }
    this.sandboxImage = this.options.sandboxImage ?? (await pushPauseImage(this.registry));
    for (const d of ['root', 'state', 'tmp', 'runc', 'net.d', 'ipam', 'pods']) await fsp.mkdir(path.join(this.dir, d));
    const hosts: Array<[string, string]> = [
      [this.registry.host, this.registry.url],
      ...(this.options.mirrorDomains ?? []).map((d): [string, string] => [d, `https://${d}`]),
    ];
    for (const [domain, server] of hosts) {
      const hostsDir = path.join(this.dir, 'certs.d', domain);
      await fsp.mkdir(hostsDir, { recursive: true });
      await fsp.writeFile(path.join(hostsDir, 'hosts.toml'), mirrorHostsToml(server, this.registry.url));
    }
    await fsp.writeFile(
      path.join(this.cniConfDir, `10-${CNI_NETWORK}.conflist`),
      cniConflist(this.dir, this.podSubnetPrefix, this.options.cniPortmap === true),
    );
    await fsp.writeFile(
      this.configPath,
      containerdConfigToml({
        dir: this.dir,
        sandboxImage: this.sandboxImage,
        logLevel: this.options.logLevel ?? 'info',
        version: this.version,
        ...(this.options.imports === undefined ? {} : { imports: this.options.imports }),
        ...(this.options.configSchema === undefined ? {} : { schema: this.options.configSchema }),
        ...(this.options.extraToml === undefined ? {} : { extraToml: this.options.extraToml }),
        ...(this.options.kataHandler === undefined ? {} : { kataHandler: this.options.kataHandler }),
        ...(this.options.kataShimPath === undefined ? {} : { kataShimPath: this.options.kataShimPath }),
      }),
    );

    this.cgroups = await createPrivateCgroups();
    await mkdirEverywhere(this.cgroups, NODE_CGROUP);
    await mkdirEverywhere(this.cgroups, DAEMON_CGROUP);
    await this.startNode();
    this.relay = await startLoopbackRelay(
      ['nsenter', `--target=${this.nodePid}`, '--net', '--'],
      Number(this.registry.host.split(':')[1]),
      this.dir,
    );
    await this.startDaemon();
    // The sandbox image now, so that a registry problem shows here and not in RunPodSandbox.
    const cri = criClient(this.criSocket);
    try {
      await cri.image.PullImage({ image: { image: this.sandboxImage } });
    } finally {
      cri.close();
    }
  }

  /** /proc/self/cgroup as it must read once a process has joined `<private>/<rel>`. */
  private async expectedCgroup(rel: string): Promise<string> {
    const own = parseProcCgroup(await fsp.readFile('/proc/self/cgroup', 'utf8'));
    return own
      .map((e) => {
        const h = this.cgroups.hierarchies.find((x) => x.own.hierarchyId === e.hierarchyId);
        const p = h === undefined ? e.path : path.posix.join(h.procPath, rel);
        return `${e.hierarchyId}:${e.controllers.join(',')}:${p}`;
      })
      .join('\n');
  }

  private joinEnv(rel: string, expected: string): Record<string, string> {
    return {
      KATA_TS_JOIN_DIRS: this.cgroups.hierarchies.map((h) => path.join(h.dir, rel)).join('\n'),
      KATA_TS_JOIN_EXPECTED: expected,
    };
  }

  private async startNode(): Promise<void> {
    const inodes: string[] = [];
    for (const h of this.cgroups.hierarchies) inodes.push(`${h.name} ${(await fsp.stat(h.dir)).ino}`);
    const log = await fsp.open(path.join(this.dir, 'node.log'), 'a');
    // join.sh puts the shell into the private root itself (the root of the new cgroup
    // namespace); node.sh then moves into <private>/node.
    const child = spawn(
      'bash',
      [
        path.join(HARNESS_DIR, 'join.sh'),
        'unshare',
        '--cgroup',
        '--mount',
        '--net',
        '--propagation',
        'private',
        '--',
        'bash',
        path.join(HARNESS_DIR, 'node.sh'),
      ],
      {
        stdio: ['ignore', 'pipe', log.fd],
        env: {
          PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
          ...this.joinEnv('', await this.expectedCgroup('')),
          KATA_TS_CGROUP_MOUNTS: this.cgroups.hierarchies.map((h) => `${h.name} ${h.mount.fsType} ${mountOptions(h.mount)}`).join('\n'),
          KATA_TS_PRIVATE_INODES: inodes.join('\n'),
          KATA_TS_NODE_CGROUP: NODE_CGROUP,
          KATA_TS_NODE_DIR: this.dir,
          KATA_TS_NODE_PRIVATE_ROOT: this.options.privateRoot === true ? '1' : '',
        },
      },
    );
    await log.close();
    this.node = child;
    this.nodePid = child.pid as number;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the node namespaces were not ready in time')), scaledMs(30_000));
      child.stdout?.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`the node holder exited (${code ?? signal}) before it was ready:\n${this.nodeLog()}`));
      });
    });
    child.stdout?.destroy();
    this.nodeNamespaces = { mnt: nsInode(this.nodePid, 'mnt'), net: nsInode(this.nodePid, 'net') };
  }

  private async startDaemon(): Promise<void> {
    const log = await fsp.open(path.join(this.dir, 'containerd.log'), 'a');
    // A fetched release's own directory first: its containerd-shim-runc-v2 runs its runc pods.
    const releaseDir = this.options.release?.binDir;
    const basePath = releaseDir == null ? containerdBasePath() : `${releaseDir}${path.delimiter}${containerdBasePath()}`;
    const child = spawn(
      'bash',
      [
        path.join(HARNESS_DIR, 'join.sh'),
        'nsenter',
        `--target=${this.nodePid}`,
        '--mount',
        '--net',
        '--cgroup',
        '--',
        this.options.release?.containerd ?? 'containerd',
        '--config',
        this.configPath,
      ],
      {
        stdio: ['ignore', log.fd, log.fd],
        env: {
          ...this.options.env,
          PATH: this.options.shimBinDir === undefined ? basePath : `${this.options.shimBinDir}${path.delimiter}${basePath}`,
          ...this.joinEnv(DAEMON_CGROUP, await this.expectedCgroup(DAEMON_CGROUP)),
        },
      },
    );
    await log.close();
    this.daemon = child;
    const cri = criClient(this.criSocket);
    try {
      await until(
        'containerd serving the CRI with runtime and network ready',
        async (note) => {
          if (child.exitCode !== null || child.signalCode !== null) {
            throw new Error(`containerd exited (${child.exitCode ?? child.signalCode}) before it served the CRI`);
          }
          // 1.x logs `failed to load plugin io.containerd.grpc.v1.cri`, 2.x `"failed to load plugin" error=... id=io.containerd.grpc.v1.cri`.
          const criFailed = /failed to load plugin.*\b(?:id=)?io\.containerd\.(?:grpc\.v1\.cri|cri\.v1\.[a-z]+)\b.*/.exec(this.logText());
          if (criFailed !== null) throw new Error(`containerd did not load its CRI plugin: ${criFailed[0]}`);
          if (!existsSync(this.criSocket)) {
            note(`no socket yet; log: ${tail(this.logText(), 2)}`);
            return undefined;
          }
          const status = await cri.runtime.Status({}, { deadline: Date.now() + 2_000 }).catch((err: Error) => {
            note(err.message);
            return undefined;
          });
          if (status === undefined) return undefined;
          const conditions = status.status?.conditions ?? [];
          note(conditions);
          const ready = (t: string) => conditions.some((c) => c.type === t && c.status);
          return ready('RuntimeReady') && ready('NetworkReady') ? true : undefined;
        },
        60_000,
        200,
      );
    } finally {
      cri.close();
    }
  }

  /** SIGTERM containerd by pid, SIGKILL if it has not gone after a while; which one it took. */
  private async killDaemon(): Promise<ContainerdStopReport['containerd']> {
    const child = this.daemon;
    if (child?.pid === undefined || child.exitCode !== null || child.signalCode !== null) return null;
    const pid = child.pid;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    process.kill(pid, 'SIGTERM');
    let signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM';
    const timer = setTimeout(() => {
      signal = 'SIGKILL';
      if (child.exitCode === null && child.signalCode === null) process.kill(pid, 'SIGKILL');
    }, scaledMs(10_000));
    await exited;
    clearTimeout(timer);
    return { pid, signal };
  }

  async restart(): Promise<void> {
    if (this.stopped !== undefined) throw new Error('restart after stop');
    await this.killDaemon();
    await this.startDaemon();
  }

  bundleDir(id: string): string {
    return path.join(this.stateDir, 'io.containerd.runtime.v2.task', CONTAINERD_NAMESPACE, id);
  }

  cgroupDirs(rel: string): string[] {
    return this.cgroups.hierarchies.map((h) => path.join(h.dir, rel));
  }

  async nodeExec(argv: string[], timeoutMs = 30_000): Promise<string> {
    const { stdout } = await execFileAsync('nsenter', [`--target=${this.nodePid}`, '--mount', '--net', '--', ...argv], {
      timeout: scaledMs(timeoutMs),
    });
    return stdout;
  }

  async mountsUnder(prefix: string = this.dir): Promise<string[]> {
    const text = await fsp.readFile(`/proc/${this.nodePid}/mountinfo`, 'utf8');
    return mountPointsUnder(text, prefix);
  }

  /** Every pid in the private tree with the cgroup (as containerd sees it) it was found in. */
  private async treeProcesses(): Promise<Map<number, string>> {
    const found = new Map<number, string>();
    for (const h of this.cgroups.hierarchies) {
      for (const d of await treeDeepestFirst(h.dir)) {
        for (const pid of await readProcs(d)) if (!found.has(pid)) found.set(pid, `/${path.relative(h.dir, d)}`);
      }
    }
    return found;
  }

  async strayProcesses(): Promise<string[]> {
    const out: string[] = [];
    for (const [pid, cgroup] of await this.treeProcesses()) {
      if (pid === this.nodePid || pid === this.daemon?.pid) continue;
      const comm = (await fsp.readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '?')).trim();
      // The command line too, after the three space-separated fields callers split on: a stray
      // `node` says nothing until one knows which shim action it runs.
      const argv = (await fsp.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).split('\0').join(' ').trim().slice(0, 300);
      out.push(`${pid} ${comm} ${cgroup}${argv === '' ? '' : ` (${argv})`}`);
    }
    return out;
  }

  async podCgroups(): Promise<string[]> {
    const out = new Set<string>();
    for (const h of this.cgroups.hierarchies) {
      for (const d of await treeDeepestFirst(h.dir)) {
        const rel = `/${path.relative(h.dir, d)}`;
        if (rel === '/' || rel === `/${NODE_CGROUP}` || rel === `/${DAEMON_CGROUP}`) continue;
        out.add(rel);
      }
    }
    return [...out].sort();
  }

  logText(): string {
    try {
      return readFileSync(path.join(this.dir, 'containerd.log'), 'utf8');
    } catch {
      return '';
    }
  }

  nodeLog(): string {
    try {
      return readFileSync(path.join(this.dir, 'node.log'), 'utf8');
    } catch {
      return '';
    }
  }

  stop(): Promise<ContainerdStopReport> {
    this.stopped ??= this.teardown();
    return this.stopped;
  }

  private async teardown(): Promise<ContainerdStopReport> {
    const leftovers: string[] = [];
    const containerd = await this.killDaemon();
    // What containerd left running (shims, containers) is ours: the tree holds nothing else.
    const strays = this.cgroups.name === '' ? [] : await this.strayProcesses();
    for (let round = 0; round < 50; round++) {
      const pids = [...(await this.treeProcesses()).keys()].filter((p) => p !== this.nodePid);
      if (pids.length === 0) break;
      for (const pid of pids) killQuietly(pid);
      await new Promise((r) => setTimeout(r, 100));
    }
    if (this.node?.pid !== undefined && this.node.exitCode === null && this.node.signalCode === null) {
      const gone = new Promise((r) => this.node?.once('exit', r));
      process.kill(this.node.pid, 'SIGKILL');
      await gone;
    }
    await this.relay?.stop();
    process.off('exit', this.emergency);
    // Nothing may remain in the node's namespaces (they die with their last process).
    for (const entry of await fsp.readdir('/proc')) {
      if (!/^[0-9]+$/.test(entry)) continue;
      const pid = Number(entry);
      const mnt = nsInode(pid, 'mnt');
      const net = nsInode(pid, 'net');
      if ((mnt !== undefined && mnt === this.nodeNamespaces.mnt) || (net !== undefined && net === this.nodeNamespaces.net)) {
        leftovers.push(`process ${pid} in the node's namespaces`);
      }
    }
    const hostMounts = mountPointsUnder(await fsp.readFile('/proc/self/mountinfo', 'utf8'), this.dir);
    leftovers.push(...hostMounts.map((m) => `host mount ${m}`));
    if (this.cgroups.name !== '') leftovers.push(...(await removePrivateCgroups(this.cgroups)).map((d) => `cgroup ${d}`));
    // KATA_TS_KEEP_TEST_DIR=1 keeps containerd's dir (its log, the pods' CRI logs) for a look.
    const keep = process.env.KATA_TS_KEEP_TEST_DIR === '1';
    if (hostMounts.length === 0 && !keep) await fsp.rm(this.dir, { recursive: true, force: true });
    if (keep) console.warn(`kept containerd's dir ${this.dir}`);
    else if (existsSync(this.dir)) leftovers.push(`directory ${this.dir}`);
    if (this.ownRegistry) await this.registry.stop();
    return { containerd, strays, leftovers };
  }

  /**
   * The last resort when this process exits without stop() (an exit handler cannot await):
   * SIGKILL every process of ours by pid, wait a little for the private tree to empty, then remove
   * it and the directories.
   */
  private killAllNow(): void {
    for (const pid of [this.daemon?.pid, this.relay?.pid, this.node?.pid]) if (pid !== undefined) killQuietly(pid);
    if (this.ownRegistry) killQuietly(this.registry.pid);
    const tick = new Int32Array(new SharedArrayBuffer(4));
    const deadline = Date.now() + 3_000;
    for (;;) {
      let left = 0;
      for (const h of this.cgroups.hierarchies) {
        if (!path.basename(h.dir).startsWith('kata-ts-test-')) continue;
        for (const d of directoriesDeepestFirstSync(h.dir)) {
          for (const pid of readFileSafe(path.join(d, 'cgroup.procs')).split('\n')) if (pid !== '') killQuietly(Number(pid));
          try {
            rmdirSync(d);
          } catch {
            left++;
          }
        }
      }
      if (left === 0 || Date.now() > deadline) break;
      Atomics.wait(tick, 0, 0, 50);
    }
    rmSync(this.dir, { recursive: true, force: true });
    if (this.ownRegistry) rmSync(this.registry.dir, { recursive: true, force: true });
  }
}

function readFileSafe(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

/** Every directory below `dir` (deepest first), then `dir`; none when it is gone. */
function directoriesDeepestFirstSync(dir: string): string[] {
  let entries: Dirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return [];
  }
  return [...entries.filter((e) => e.isDirectory()).flatMap((e) => directoriesDeepestFirstSync(path.join(dir, e.name))), dir];
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone already
  }
}

/** Mount points at or below `prefix` in a mountinfo text. */
export function mountPointsUnder(mountinfo: string, prefix: string): string[] {
  const out: string[] = [];
  for (const line of mountinfo.split('\n')) {
    const field = line.split(' ')[4];
    if (field === undefined) continue;
    const mountPoint = field.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(Number.parseInt(oct, 8)));
    if (prefix === '/' || mountPoint === prefix || mountPoint.startsWith(`${prefix}/`)) out.push(mountPoint);
  }
  return out;
}
