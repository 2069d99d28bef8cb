import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Client, Metadata, type ServiceError, status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/common/logger.js';
import { parseConfigDocument } from '../../../src/config/load.js';
import { type Daemon, startDaemon } from '../../../src/daemon/daemon.js';
import { removeMountNamespace } from '../../../src/runtime/mount-namespace.js';
import { type CriClient, criClient } from '../../helpers/cri-client.js';
import { expectGrpcError } from '../../helpers/cri-expect.js';

const pkg = JSON.parse(await readFile(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string };

async function daemonWith(dir: string, doc: Record<string, unknown>): Promise<Daemon> {
  const config = parseConfigDocument(
    { socketPath: path.join(dir, 'kata-ts.sock'), stateDir: path.join(dir, 'state'), metricsAddress: '127.0.0.1:0', ...doc },
    'test',
  );
  return startDaemon({ loaded: { config, path: null }, logger: silentLogger() });
}

/** Send raw bytes as the request body of a method, bypassing protobuf encoding. */
function rawCall(client: Client, method: string, body: Buffer): Promise<unknown> {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(
      `/runtime.v1.RuntimeService/${method}`,
      (b: Buffer) => b,
      (b: Buffer) => b,
      body,
      new Metadata(),
      { deadline: Date.now() + 10_000 },
      (err: ServiceError | null, res?: Buffer) => (err ? reject(err) : resolve(res)),
    );
  });
}

describe('CRI foundation over a real unix socket', () => {
  let dir: string;
  let daemon: Daemon;
  let cri: CriClient;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-cri-'));
    // No CNI config where it looks (a directory of the test's): NetworkReady false, naming why.
    daemon = await daemonWith(dir, { cgroupDriver: 'cgroupfs', network: { cniConfDir: path.join(dir, 'net.d') } });
    cri = criClient(daemon.socketPath);
  });
  afterAll(async () => {
    cri?.close();
    await daemon?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('listens on a 0660 socket', async () => {
    const st = await stat(daemon.socketPath);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);
  });

  it('Version names kata-ts, its package version and CRI v1', async () => {
    const res = await cri.runtime.Version({ version: '0.1.0' });
    expect(res).toEqual({ version: '0.1.0', runtime_name: 'kata-ts', runtime_version: pkg.version, runtime_api_version: 'v1' });
  });

  it('Status lists the handlers (the default again as ""), features, conditions and verbose info', async () => {
    const res = await cri.runtime.Status({ verbose: true });
    expect(res.runtime_handlers.map((h) => h.name)).toEqual(['', 'kata-ts', 'kata-ts-cvm']);
    expect(res.runtime_handlers[0]!.features).toEqual({ recursive_read_only_mounts: true, user_namespaces: false });
    expect(res.features).toEqual({ supplemental_groups_policy: true, user_namespaces_host_network: false });
    const types = res.status!.conditions.map((c) => c.type);
    expect(types).toEqual(['RuntimeReady', 'NetworkReady']);
    const network = res.status!.conditions[1]!;
    expect(network).toMatchObject({ status: false, reason: 'NoCniConfig' });
    expect(JSON.parse(res.info.network!)).toMatchObject({ mode: 'cni', ready: false });
    expect(JSON.parse(res.info.cgroupDriver!)).toEqual({ name: 'cgroupfs', source: 'config' });
    expect(['kvm', 'tcg']).toContain(JSON.parse(res.info.acceleration!).accel);
    expect(Object.keys(JSON.parse(res.info.handlers!))).toEqual(['kata-ts', 'kata-ts-cvm']);
    expect(JSON.parse(res.info.config!)).toMatchObject({ socketPath: daemon.socketPath });
    expect(JSON.parse(res.info.streaming!)).toEqual({ url: daemon.streamingUrl });
    expect(daemon.streamingUrl).toMatch(/^http:\/\/127\.0\.0\.1:[1-9][0-9]*$/);
    const quiet = await cri.runtime.Status({ verbose: false });
    expect(quiet.info).toEqual({});
  });

  it('RuntimeConfig reports CGROUPFS explicitly when the config says cgroupfs', async () => {
    const res = await cri.runtime.RuntimeConfig({});
    expect(res).toEqual({ linux: { cgroup_driver: 'CGROUPFS' } });
  });

  it('UpdateRuntimeConfig is accepted', async () => {
    await expect(cri.runtime.UpdateRuntimeConfig({ runtime_config: { network_config: { pod_cidr: '10.1.0.0/24' } } })).resolves.toEqual({});
  });

  it('rpcs not implemented yet answer UNIMPLEMENTED with a sentence naming the rpc', async () => {
    for (const method of ['CheckpointContainer', 'ListPodSandboxMetrics'] as const) {
      const err = await expectGrpcError(cri.runtime[method]({}), status.UNIMPLEMENTED, 'RPC_UNIMPLEMENTED');
      expect(err.details).toBe(`${method} is not implemented by kata-ts yet`);
    }
  });

  it('Exec, Attach and PortForward are validated as the kubelet does, naming the field', async () => {
    let err = await expectGrpcError(cri.runtime.Exec({ cmd: ['true'], stdout: true }), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/container_id/);
    err = await expectGrpcError(cri.runtime.Attach({ container_id: 'c', tty: true, stderr: true }), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/tty and stderr/);
    err = await expectGrpcError(cri.runtime.Exec({ container_id: 'c', cmd: ['true'] }), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/stdin, stdout, or stderr/);
    err = await expectGrpcError(cri.runtime.PortForward({}), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/pod_sandbox_id/);
    err = await expectGrpcError(cri.runtime.Exec({ container_id: 'nope', cmd: ['true'], stdout: true }), status.NOT_FOUND);
    expect(err.details).toMatch(/nope/);
    err = await expectGrpcError(cri.runtime.PortForward({ pod_sandbox_id: 'nope', port: [80] }), status.NOT_FOUND);
    expect(err.details).toMatch(/nope/);
  });

  it('garbage bytes and wrong wire types get INVALID_ARGUMENT, and the server answers the next call', async () => {
    const garbage = Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    let err = await expectGrpcError(rawCall(cri.grpc.runtime, 'Version', garbage), status.INVALID_ARGUMENT, 'REQUEST_UNDECODABLE');
    expect(err.details).toMatch(/^request body is not a valid VersionRequest/);
    // Field 1 of StatusRequest is a bool; send it as a length-delimited field claiming 100 bytes.
    err = await expectGrpcError(rawCall(cri.grpc.runtime, 'Status', Buffer.from([0x0a, 0x64, 0x01])), status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/StatusRequest/);
    await expect(cri.runtime.Version({})).resolves.toMatchObject({ runtime_name: 'kata-ts' });
  });

  it('counts requests per rpc and status code on the metrics endpoint', async () => {
    const res = await fetch(`http://${daemon.metricsAddress}/metrics`);
    const text = await res.text();
    expect(text).toMatch(/kata_ts_grpc_requests_total\{method="Version",code="OK"\} [1-9]/);
    expect(text).toMatch(/kata_ts_grpc_requests_total\{method="CheckpointContainer",code="UNIMPLEMENTED"\} 1/);
    expect(text).toMatch(/kata_ts_grpc_request_duration_seconds_bucket\{le="0.005",method="Status"\}/);
  });
});

describe('RuntimeConfig and the advertised driver agree in every setting', () => {
  it.each([
    ['systemd', false, 'SYSTEMD', 'config'],
    ['cgroupfs', true, 'CGROUPFS', 'config'],
    ['auto', true, 'SYSTEMD', 'detected'],
    ['auto', false, 'CGROUPFS', 'detected'],
  ] as const)('cgroupDriver %s (systemd dir present: %s) -> %s', async (setting, systemdDir, expected, source) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-rc-'));
    const runtimeDir = path.join(dir, 'run-systemd-system');
    if (systemdDir) await mkdir(runtimeDir);
    const daemon = await daemonWith(dir, { cgroupDriver: setting, systemdRuntimeDir: runtimeDir, metricsAddress: null });
    const cri = criClient(daemon.socketPath);
    try {
      expect(await cri.runtime.RuntimeConfig({})).toEqual({ linux: { cgroup_driver: expected } });
      const st = await cri.runtime.Status({ verbose: true });
      expect(JSON.parse(st.info.cgroupDriver!)).toEqual({ name: expected.toLowerCase(), source });
    } finally {
      cri.close();
      await daemon.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('socket handling', () => {
  it('replaces a stale socket but refuses one another process is serving on', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-sock-'));
    const socketPath = path.join(dir, 'kata-ts.sock');
    // Another process serving on the path; SIGKILL later leaves its socket file behind, exactly
    // what a crashed daemon leaves.
    const other = spawn(
      process.execPath,
      ['-e', `require('net').createServer().listen(${JSON.stringify(socketPath)}, () => console.log('up'))`],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    try {
      await new Promise<void>((resolve) => other.stdout!.once('data', () => resolve()));
      await expect(daemonWith(dir, { metricsAddress: null })).rejects.toMatchObject({ reason: 'SOCKET_IN_USE' });
      const gone = new Promise((resolve) => other.once('exit', resolve));
      other.kill('SIGKILL');
      await gone;
      expect((await stat(socketPath)).isSocket()).toBe(true);
      const daemon = await daemonWith(dir, { metricsAddress: null });
      const cri = criClient(daemon.socketPath);
      await expect(cri.runtime.Version({})).resolves.toMatchObject({ runtime_name: 'kata-ts' });
      cri.close();
      await daemon.close();
    } finally {
      if (other.exitCode === null && other.signalCode === null) other.kill('SIGKILL');
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('refuses a path that is not a socket', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-sock-'));
    try {
      await writeFile(path.join(dir, 'kata-ts.sock'), 'not a socket');
      await expect(daemonWith(dir, { metricsAddress: null })).rejects.toMatchObject({ reason: 'SOCKET_PATH_OCCUPIED' });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('kata-ts serve as a process', () => {
  it('serves on the socket from --socket and stops gracefully on SIGTERM', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kata-ts-serve-'));
    const socketPath = path.join(dir, 'k.sock');
    const configPath = path.join(dir, 'config.json');
    const mountNamespacePath = path.join(dir, 'mntns', 'mnt');
    await writeFile(
      configPath,
      JSON.stringify({ metricsAddress: null, stateDir: path.join(dir, 'state'), logLevel: 'info', mountNamespacePath }),
    );
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'src/cli/entry.ts', 'serve', '--config', configPath, '--socket', socketPath],
      {
        cwd: path.join(__dirname, '../../..'),
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    try {
      for (let i = 0; i < 200; i++) {
        if (
          await stat(socketPath).then(
            () => true,
            () => false,
          )
        )
          break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const cri = criClient(socketPath);
      await expect(cri.runtime.Version({})).resolves.toMatchObject({ runtime_name: 'kata-ts' });
      cri.close();
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      await expect(stat(socketPath)).rejects.toMatchObject({ code: 'ENOENT' });
      // Every request is logged as one JSON line with the rpc and its duration.
      const line = stderr.split('\n').find((l) => l.includes('"rpc":"Version"'));
      expect(JSON.parse(line!)).toMatchObject({ rpc: 'Version', code: 'OK', durationMs: expect.any(Number) });
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      await removeMountNamespace(mountNamespacePath);
      await rm(dir, { recursive: true, force: true });
    }
  });
});
