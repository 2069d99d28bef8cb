/**
 * containerd's shim messages (src/shim/proto.ts over proto/containerd/): field numbers and wire
 * types of the messages that matter most, checked against bytes built by hand; the Any type
 * urls containerd 1.6 expects; timestamps; and the typed method table served under the task
 * API's v2 and v3 names.
 */
import { Buffer } from 'node:buffer';
import { afterEach, describe, expect, it } from 'vitest';
import { RpcCode } from '../../../src/common/status-codes.js';
import {
  anyOf,
  anyTypeName,
  decodeAny,
  decodeJsonAny,
  decodeMessage,
  encodeMessage,
  isMessageName,
  jsonAnyOf,
  nsOfTimestamp,
  OCI_TYPE_URLS,
  serviceMethods,
  TASK_METHODS,
  TASK_SERVICE_NAMES,
  type TaskHandlers,
  timestampOfNs,
} from '../../../src/shim/proto.js';
import { connectTtrpc, type TtrpcClient, TtrpcServer, TtrpcStatusError } from '../../../src/ttrpc/index.js';
import { rejection, thrown } from '../../helpers/kata-error.js';
import { socketDir } from '../ttrpc/helpers.js';
import { cat, lfield, vfield } from './wire.js';

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');

describe('containerd.task.v2.CreateTaskRequest', () => {
  const bytes = cat(
    lfield(1, 'c1'),
    lfield(2, '/run/bundle/c1'),
    lfield(3, cat(lfield(1, 'overlay'), lfield(2, 'overlay'), lfield(4, 'lowerdir=/l'), lfield(4, 'upperdir=/u'))),
    vfield(4, true),
    lfield(5, '/fifo/in'),
    lfield(6, '/fifo/out'),
    lfield(7, '/fifo/err'),
    lfield(8, '/ckpt'),
    lfield(9, '/parent'),
    lfield(10, cat(lfield(1, 'containerd.runc.v1.Options'), lfield(2, Buffer.from([0x08, 0x01])))),
  );

  it('decodes id 1, bundle 2, rootfs 3 (Mount type 1, source 2, options 4), terminal 4, stdio 5-7, checkpoints 8-9, options 10', () => {
    expect(decodeMessage('containerd.task.v2.CreateTaskRequest', bytes)).toEqual({
      id: 'c1',
      bundle: '/run/bundle/c1',
      rootfs: [{ type: 'overlay', source: 'overlay', target: '', options: ['lowerdir=/l', 'upperdir=/u'] }],
      terminal: true,
      stdin: '/fifo/in',
      stdout: '/fifo/out',
      stderr: '/fifo/err',
      checkpoint: '/ckpt',
      parent_checkpoint: '/parent',
      options: { type_url: 'containerd.runc.v1.Options', value: Buffer.from([0x08, 0x01]) },
    });
  });

  it('encodes to the same bytes', () => {
    const value = decodeMessage('containerd.task.v2.CreateTaskRequest', bytes);
    expect(hex(encodeMessage('containerd.task.v2.CreateTaskRequest', value))).toBe(hex(bytes));
  });

  it('decodes an empty request with every default: strings empty, lists empty, messages null', () => {
    expect(decodeMessage('containerd.task.v2.CreateTaskRequest', Buffer.alloc(0))).toEqual({
      id: '',
      bundle: '',
      rootfs: [],
      terminal: false,
      stdin: '',
      stdout: '',
      stderr: '',
      checkpoint: '',
      parent_checkpoint: '',
      options: null,
    });
  });

  it('refuses bytes that are no message as INVALID_ARGUMENT', () => {
    // A rootfs Mount announced as 5 bytes with 1 there; an unknown field of wire type 7.
    for (const bad of [[0x1a, 0x05, 0x0a], [0x7f]]) {
      const err = thrown(() => decodeMessage('containerd.task.v2.CreateTaskRequest', Buffer.from(bad)));
      expect([err.kind, err.reason]).toEqual(['invalid', 'SHIM_PROTO_BAD_MESSAGE']);
    }
  });

  it('leaves out scalars at their default, as proto3 does, but keeps present messages', () => {
    const bytes = encodeMessage('containerd.task.v2.CreateTaskRequest', { id: '', terminal: false, rootfs: [{ type: '', options: [] }] });
    expect(hex(bytes)).toBe(hex(lfield(3, Buffer.alloc(0))));
    const exited = encodeMessage('containerd.task.v2.WaitResponse', { exit_status: 0, exited_at: { seconds: '0', nanos: 0 } });
    expect(hex(exited)).toBe(hex(lfield(2, Buffer.alloc(0))));
    expect(hex(encodeMessage('containerd.task.v2.StateResponse', { status: 'UNKNOWN' }))).toBe('');
  });
});

describe('exit reports', () => {
  // 2023-11-14T22:13:20.000000005Z
  const exitedNs = 1_700_000_000_000_000_005n;
  const timestamp = cat(vfield(1, 1_700_000_000), vfield(2, 5));

  it('WaitResponse: exit_status 1, exited_at 2 (Timestamp seconds 1, nanos 2)', () => {
    const bytes = encodeMessage('containerd.task.v2.WaitResponse', { exit_status: 137, exited_at: timestampOfNs(exitedNs) });
    expect(hex(bytes)).toBe(hex(cat(vfield(1, 137), lfield(2, timestamp))));
    expect(decodeMessage('containerd.task.v2.WaitResponse', bytes)).toEqual({
      exit_status: 137,
      exited_at: { seconds: '1700000000', nanos: 5 },
    });
  });

  it('DeleteResponse: pid 1, exit_status 2, exited_at 3; no exited_at sends no field and decodes as null', () => {
    const bytes = encodeMessage('containerd.task.v2.DeleteResponse', { pid: 4242, exit_status: 1, exited_at: timestampOfNs(exitedNs) });
    expect(hex(bytes)).toBe(hex(cat(vfield(1, 4242), vfield(2, 1), lfield(3, timestamp))));
    const unexited = encodeMessage('containerd.task.v2.DeleteResponse', { pid: 7, exited_at: null });
    expect(hex(unexited)).toBe(hex(vfield(1, 7)));
    expect(decodeMessage('containerd.task.v2.DeleteResponse', unexited)).toEqual({ pid: 7, exit_status: 0, exited_at: null });
  });

  it('TaskExit event: container_id 1, id 2, pid 3, exit_status 4, exited_at 5, in an Any named containerd.events.TaskExit', () => {
    const any = anyOf('containerd.events.TaskExit', {
      container_id: 'c1',
      id: 'e1',
      pid: 99,
      exit_status: 2,
      exited_at: timestampOfNs(exitedNs),
    });
    expect(any.type_url).toBe('containerd.events.TaskExit');
    expect(hex(any.value)).toBe(hex(cat(lfield(1, 'c1'), lfield(2, 'e1'), vfield(3, 99), vfield(4, 2), lfield(5, timestamp))));
  });

  it('StateResponse: status 4 as the enum number, decoded by name', () => {
    const bytes = encodeMessage('containerd.task.v2.StateResponse', { id: 'c1', pid: 5, status: 'RUNNING', exec_id: 'e' });
    expect(hex(bytes)).toBe(hex(cat(lfield(1, 'c1'), vfield(3, 5), vfield(4, 2), lfield(11, 'e'))));
    expect(decodeMessage('containerd.task.v2.StateResponse', bytes).status).toBe('RUNNING');
    expect(decodeMessage('containerd.task.v2.StateResponse', vfield(4, 5)).status).toBe('PAUSING');
  });
});

describe('cgroup metrics', () => {
  // The "no limit" value cgroup v1 reports: above 2^53, so it must survive as a decimal string.
  const unlimited = 9_223_372_036_854_771_712n;

  it('v1: Metrics.memory 4 -> MemoryStat.usage 33 (MemoryEntry limit 1, usage 2, max 3, failcnt 4), total_inactive_file 30', () => {
    const memory = cat(vfield(30, 4096), lfield(33, cat(vfield(1, unlimited), vfield(2, 1_048_576), vfield(3, 2_097_152), vfield(4, 3))));
    const bytes = lfield(4, memory);
    const metrics = decodeMessage('io.containerd.cgroups.v1.Metrics', bytes);
    expect(metrics.memory?.usage).toEqual({ limit: unlimited.toString(), usage: '1048576', max: '2097152', failcnt: '3' });
    expect(metrics.memory?.total_inactive_file).toBe('4096');
    expect(metrics.memory?.swap).toBeNull();
    expect(metrics.hugetlb).toEqual([]);
    const encoded = encodeMessage('io.containerd.cgroups.v1.Metrics', {
      memory: { total_inactive_file: 4096, usage: { limit: unlimited.toString(), usage: 1_048_576, max: '2097152', failcnt: 3 } },
    });
    expect(hex(encoded)).toBe(hex(bytes));
  });

  it('v1: cpu 3 -> usage 1 (total 1, per_cpu 4 packed)', () => {
    const bytes = encodeMessage('io.containerd.cgroups.v1.Metrics', { cpu: { usage: { total: 10, per_cpu: [4, 6] } } });
    expect(hex(bytes)).toBe(hex(lfield(3, lfield(1, cat(vfield(1, 10), lfield(4, Buffer.from([4, 6])))))));
  });

  it('v2: Metrics.memory 4 -> usage 32, usage_limit 33, inactive_file 13; cpu 2 -> usage_usec 1', () => {
    const bytes = encodeMessage('io.containerd.cgroups.v2.Metrics', {
      cpu: { usage_usec: 500 },
      memory: { inactive_file: 10, usage: 100, usage_limit: '200' },
    });
    expect(hex(bytes)).toBe(hex(cat(lfield(2, vfield(1, 500)), lfield(4, cat(vfield(13, 10), vfield(32, 100), vfield(33, 200))))));
  });

  it('a Stats answer carries them under their bare names', () => {
    const stats = anyOf('io.containerd.cgroups.v2.Metrics', { pids: { current: 3 } });
    expect(stats.type_url).toBe('io.containerd.cgroups.v2.Metrics');
    const response = decodeMessage('containerd.task.v2.StatsResponse', encodeMessage('containerd.task.v2.StatsResponse', { stats }));
    expect(decodeAny(response.stats!, 'io.containerd.cgroups.v2.Metrics').pids).toEqual({ current: '3', limit: '0' });
  });
});

describe('Any', () => {
  it('type urls are the bare full names containerd 1.6 registers, for events and metrics', () => {
    expect(anyOf('containerd.events.TaskOOM', { container_id: 'c' }).type_url).toBe('containerd.events.TaskOOM');
    expect(anyOf('containerd.events.TaskExecStarted', {}).type_url).toBe('containerd.events.TaskExecStarted');
    expect(anyOf('io.containerd.cgroups.v1.Metrics', {}).type_url).toBe('io.containerd.cgroups.v1.Metrics');
  });

  it('decodeAny checks the type; a type.googleapis.com/ prefix is tolerated', () => {
    const any = anyOf('containerd.events.TaskStart', { container_id: 'c', pid: 3 });
    expect(decodeAny(any, 'containerd.events.TaskStart')).toEqual({ container_id: 'c', pid: 3 });
    const prefixed = { type_url: `type.googleapis.com/${any.type_url}`, value: any.value };
    expect(anyTypeName(prefixed)).toBe('containerd.events.TaskStart');
    expect(decodeAny(prefixed, 'containerd.events.TaskStart').pid).toBe(3);
    const err = thrown(() => decodeAny(any, 'containerd.events.TaskExit'));
    expect([err.kind, err.reason]).toEqual(['invalid', 'SHIM_PROTO_ANY_TYPE']);
  });

  it('OCI types travel as JSON under types.containerd.io urls', () => {
    expect(OCI_TYPE_URLS.process).toBe('types.containerd.io/opencontainers/runtime-spec/1/Process');
    expect(OCI_TYPE_URLS.linuxResources).toBe('types.containerd.io/opencontainers/runtime-spec/1/LinuxResources');
    const process = { args: ['sh'], cwd: '/' };
    const request = decodeMessage(
      'containerd.task.v2.ExecProcessRequest',
      encodeMessage('containerd.task.v2.ExecProcessRequest', { id: 'c', exec_id: 'e', spec: jsonAnyOf(OCI_TYPE_URLS.process, process) }),
    );
    expect(decodeJsonAny(request.spec!, OCI_TYPE_URLS.process)).toEqual(process);
    expect(thrown(() => decodeJsonAny(request.spec!, OCI_TYPE_URLS.linuxResources)).reason).toBe('SHIM_PROTO_ANY_TYPE');
    const broken = { type_url: OCI_TYPE_URLS.process, value: Buffer.from('{no') };
    expect(thrown(() => decodeJsonAny(broken, OCI_TYPE_URLS.process)).reason).toBe('SHIM_PROTO_BAD_JSON');
  });

  it('UpdateTaskRequest carries annotations as a map (field 3)', () => {
    const bytes = encodeMessage('containerd.task.v2.UpdateTaskRequest', { id: 'c', annotations: { a: 'b' } });
    expect(hex(bytes)).toBe(hex(cat(lfield(1, 'c'), lfield(3, cat(lfield(1, 'a'), lfield(2, 'b'))))));
    expect(decodeMessage('containerd.task.v2.UpdateTaskRequest', bytes)).toEqual({ id: 'c', resources: null, annotations: { a: 'b' } });
  });
});

describe('names and timestamps', () => {
  it('message names are checked by the compiler and at run time', () => {
    // @ts-expect-error no such message
    expect(() => encodeMessage('containerd.task.v2.Nope', {})).toThrow();
    // @ts-expect-error TaskExit has no field `exitCode`
    encodeMessage('containerd.events.TaskExit', { exitCode: 1 });
    expect(isMessageName('containerd.services.events.ttrpc.v1.Envelope')).toBe(true);
    expect(isMessageName('containerd.task.v2.Task')).toBe(false);
  });

  it('timestamps convert from and to ns since the epoch, before 1970 too', () => {
    for (const ns of [0n, 1n, 999_999_999n, 1_700_000_000_123_456_789n, -1n, -1_500_000_000n]) {
      const ts = timestampOfNs(ns);
      expect(ts.nanos).toBeGreaterThanOrEqual(0);
      expect(ts.nanos).toBeLessThan(1e9);
      expect(nsOfTimestamp(ts)).toBe(ns);
    }
    expect(timestampOfNs(-1n)).toEqual({ seconds: '-1', nanos: 999_999_999 });
    expect(nsOfTimestamp(null)).toBeUndefined();
  });
});

describe('the task service method table', () => {
  let dir: ReturnType<typeof socketDir> | undefined;
  let server: TtrpcServer | undefined;
  let client: TtrpcClient | undefined;

  afterEach(async () => {
    await client?.close();
    server?.destroy();
    dir?.remove();
  });

  it('lists the 17 methods of containerd.task.v2.Task with their messages', () => {
    expect(Object.keys(TASK_METHODS)).toEqual([
      'State',
      'Create',
      'Start',
      'Delete',
      'Pids',
      'Pause',
      'Resume',
      'Checkpoint',
      'Kill',
      'Exec',
      'ResizePty',
      'CloseIO',
      'Update',
      'Wait',
      'Stats',
      'Connect',
      'Shutdown',
    ]);
    expect(TASK_METHODS.Exec).toEqual({ request: 'containerd.task.v2.ExecProcessRequest', response: 'google.protobuf.Empty' });
    expect(TASK_SERVICE_NAMES).toEqual(['containerd.task.v2.Task', 'containerd.task.v3.Task']);
  });

  it('serves one typed table under both names: requests decoded, answers encoded, bad bytes INVALID_ARGUMENT', async () => {
    const notUsed = async (): Promise<never> => {
      throw new Error('not called');
    };
    const handlers: TaskHandlers = {
      State: notUsed,
      Create: (req) => ({ pid: req.rootfs.length + 100 }),
      Start: notUsed,
      Delete: notUsed,
      Pids: notUsed,
      Pause: notUsed,
      Resume: notUsed,
      Checkpoint: notUsed,
      Kill: (req) => {
        expect(req).toEqual({ id: 'c', exec_id: '', signal: 9, all: true });
        return {};
      },
      Exec: notUsed,
      ResizePty: notUsed,
      CloseIO: notUsed,
      Update: notUsed,
      Wait: async () => ({ exit_status: 3, exited_at: timestampOfNs(5n) }),
      Stats: notUsed,
      Connect: notUsed,
      Shutdown: notUsed,
    };
    dir = socketDir();
    server = new TtrpcServer();
    const table = serviceMethods('containerd.task.v2.Task', handlers);
    for (const name of TASK_SERVICE_NAMES) server.register(name, table);
    await server.listen(dir.socket('shim.sock'));
    client = await connectTtrpc(dir.socket('shim.sock'));

    for (const service of TASK_SERVICE_NAMES) {
      const create = encodeMessage('containerd.task.v2.CreateTaskRequest', { id: 'c', rootfs: [{ type: 'bind' }, { type: 'overlay' }] });
      const answer = await client.call(service, 'Create', create);
      expect(decodeMessage('containerd.task.v2.CreateTaskResponse', answer)).toEqual({ pid: 102 });
    }
    const wait = await client.call('containerd.task.v3.Task', 'Wait', encodeMessage('containerd.task.v2.WaitRequest', { id: 'c' }));
    expect(decodeMessage('containerd.task.v2.WaitResponse', wait)).toEqual({ exit_status: 3, exited_at: { seconds: '0', nanos: 5 } });
    const kill = await client.call(
      'containerd.task.v2.Task',
      'Kill',
      encodeMessage('containerd.task.v2.KillRequest', { id: 'c', signal: 9, all: true }),
    );
    expect(kill.length).toBe(0);

    const bad = await rejection(client.call('containerd.task.v2.Task', 'Create', Buffer.from([0x1a, 0x05, 0x0a])));
    expect(bad).toBeInstanceOf(TtrpcStatusError);
    expect((bad as TtrpcStatusError).code).toBe(RpcCode.INVALID_ARGUMENT);
  });
});
