/**
 * A node for the shim's integration tests: a private dir, the test shim (the repo's sources) on
 * a bin dir of its own, a loopback registry, the real containerd started privately with that bin
 * dir on its PATH, and a CRI client on containerd's socket. Made at describe level, started in
 * beforeAll and stopped in afterAll: `stop()` takes down whatever `start()` got to, also after a
 * start that failed half-way, and throws when the containerd harness left anything behind.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { type ContainerdHandle, type ContainerdOptions, startContainerd } from './containerd.js';
import { type CriClient, criClient } from './cri-client.js';
import { type RegistryHandle, startRegistry } from './images-registry.js';
import { liveProcessesMentioning } from './processes.js';
import { installTestShim, shimTestConfig } from './shim-config.js';

export interface ShimNodeOptions {
  /** The shim config's entries beyond shimTestConfig's (the runtime's mount namespace is always set). */
  shimConfig?: Record<string, unknown>;
  /** containerd's options beyond the registry and the shim's bin dir. */
  containerd?: Omit<ContainerdOptions, 'registry' | 'shimBinDir'>;
}

export class ShimNode {
  /** The test's own dir (`<tmpPrefix>XXXXXX`): the shim's config, bin dir and state root. */
  dir = '';
  private registryHandle: RegistryHandle | undefined;
  private ctrdHandle: ContainerdHandle | undefined;
  private client: CriClient | undefined;

  /** `tmpPrefix`: the dir's name prefix under /tmp (one per test file, to tell leftovers apart). */
  constructor(private readonly tmpPrefix: string) {}

  /** The shims' state root (`<dir>/shim`): a pod's state is `<stateRoot>/k8s.io/<pod id:16>`. */
  get stateRoot(): string {
    return this.dir === '' ? '' : path.join(this.dir, 'shim');
  }

  get binDir(): string {
    return path.join(this.dir, 'bin');
  }

  /** The runtime's mount namespace, bound by the first shim start inside the harness's node. */
  get mountNamespacePath(): string {
    return path.join(this.dir, 'mntns', 'mnt');
  }

  get registry(): RegistryHandle {
    return started(this.registryHandle, 'registry');
  }

  get ctrd(): ContainerdHandle {
    return started(this.ctrdHandle, 'containerd');
  }

  get cri(): CriClient {
    return started(this.client, 'CRI client');
  }

  async start(options: ShimNodeOptions = {}): Promise<void> {
    this.dir = await fsp.mkdtemp(this.tmpPrefix);
    await installTestShim(
      path.join(this.binDir, 'containerd-shim-kata-ts-v2'),
      path.join(this.dir, 'kata-ts.json'),
      shimTestConfig(this.dir, this.stateRoot, { mountNamespacePath: this.mountNamespacePath, ...options.shimConfig }),
    );
    this.registryHandle = await startRegistry();
    this.ctrdHandle = await startContainerd({ ...options.containerd, registry: this.registryHandle, shimBinDir: this.binDir });
    this.client = criClient(this.ctrdHandle.criSocket);
  }

  /** containerd restarted (its shims keep running); the CRI client reconnects. */
  async restartContainerd(): Promise<void> {
    this.client?.close();
    await this.ctrd.restart();
    this.client = criClient(this.ctrd.criSocket);
  }

  /** The dir a pod's CRI logs go to (`log_directory`), made, as the kubelet makes it. */
  async podLogDir(name: string, uid: string): Promise<string> {
    const dir = path.join(this.ctrd.dir, 'pods', `default_${name}_${uid}`);
    await fsp.mkdir(dir, { recursive: true });
    return dir;
  }

  async stop(): Promise<void> {
    this.client?.close();
    const report = await this.ctrdHandle?.stop();
    await this.registryHandle?.stop();
    // A pod VM left by a failed test: its QEMU and virtiofsd name the state root.
    if (this.stateRoot !== '') for (const pid of liveProcessesMentioning(this.stateRoot)) process.kill(pid, 'SIGKILL');
    // KATA_TS_KEEP_TEST_DIR=1 keeps the shim's logs and state (debugging a failure).
    if (this.dir !== '' && process.env.KATA_TS_KEEP_TEST_DIR !== '1') await fsp.rm(this.dir, { recursive: true, force: true });
    if (report !== undefined && report.leftovers.length > 0) throw new Error(`the containerd harness left: ${report.leftovers.join('; ')}`);
  }
}

function started<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw new Error(`the shim node's ${what} is not started (beforeAll failed?)`);
  return value;
}
