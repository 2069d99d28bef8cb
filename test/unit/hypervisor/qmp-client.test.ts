import { describe, expect, it } from 'vitest';
import { QmpClient, QmpError, type QmpEvent } from '../../../src/hypervisor/qmp/client.js';
import { type Chunking, loadTranscript, parseTranscript, TranscriptReplay } from '../../helpers/hypervisor-qmp-replay.js';
import { rejection } from '../../helpers/kata-error.js';

const chunkings: Chunking[] = ['lines', 'bytes', 'merged', 'odd'];

describe('QmpClient replaying recorded QEMU 7.2 transcripts', () => {
  it.each(chunkings)('negotiates, queries and delivers events interleaved with replies (%s chunks)', async (chunking) => {
    const replay = new TranscriptReplay(loadTranscript('lifecycle'), { chunking });
    const qmp = await QmpClient.open(replay.client);
    expect(qmp.greeting?.version.qemu).toEqual({ major: 7, minor: 2, micro: 22 });

    const order: string[] = [];
    qmp.on('*', (e) => order.push(`event ${e.event}`));
    expect(await qmp.queryStatus()).toMatchObject({ status: 'prelaunch', running: false });
    // QEMU sends RESUME before the reply to cont: the listener must have run when cont resolves.
    await qmp.cont().then(() => order.push('cont returned'));
    expect(await qmp.queryStatus()).toMatchObject({ status: 'running', running: true });
    await qmp.stop().then(() => order.push('stop returned'));
    expect((await qmp.queryStatus()).status).toBe('paused');
    const shutdown = qmp.waitForEvent('SHUTDOWN', (e) => e.data?.reason === 'host-qmp-quit', 5000);
    await qmp.quit();
    expect((await shutdown).data).toEqual({ guest: false, reason: 'host-qmp-quit' });
    expect(await qmp.closed).toEqual({});
    expect(order).toEqual(['event RESUME', 'cont returned', 'event STOP', 'stop returned', 'event SHUTDOWN']);
    expect(replay.mismatches).toEqual([]);
    expect(replay.finished).toBe(true);
  });

  it.each(chunkings)('returns typed query results (%s chunks)', async (chunking) => {
    const replay = new TranscriptReplay(loadTranscript('queries'), { chunking });
    const qmp = await QmpClient.open(replay.client);
    const cpus = await qmp.queryCpusFast();
    expect(cpus.map((c) => c['cpu-index'])).toEqual([0, 1]);
    const slots = await qmp.queryHotpluggableCpus();
    expect(slots).toHaveLength(4);
    expect(slots.filter((s) => s['qom-path'] === undefined).map((s) => s.props['core-id'])).toEqual([3, 2]);
    expect(await qmp.queryMemorySizeSummary()).toEqual({ 'base-memory': 256 * 1024 * 1024, 'plugged-memory': 0 });
    const pci = await qmp.queryPci();
    const vmem = pci[0]?.devices.find((d) => d.qdev_id === 'vmem0');
    expect(vmem).toMatchObject({ bus: 0, slot: 3, function: 0 });
    expect(await qmp.qomGet<number>('/machine/peripheral/vmem0', 'requested-size')).toBe(0);
    await qmp.qomSet('/machine/peripheral/vmem0', 'requested-size', 256 * 1024 * 1024);
    expect(await qmp.qomGet<number>('/machine/peripheral/vmem0', 'requested-size')).toBe(256 * 1024 * 1024);
    await qmp.quit();
    await qmp.closed;
    expect(replay.mismatches).toEqual([]);
    expect(replay.finished).toBe(true);
  });

  it('hot-plugs a CPU, adds an object and waits for DEVICE_DELETED', async () => {
    const replay = new TranscriptReplay(loadTranscript('hotplug'), { chunking: 'odd' });
    const qmp = await QmpClient.open(replay.client);
    const free = (await qmp.queryHotpluggableCpus()).find((s) => s['qom-path'] === undefined);
    expect(free).toBeDefined();
    await qmp.deviceAdd({ driver: free!.type, id: 'cpu-1', ...free!.props });
    expect((await qmp.queryCpusFast()).map((c) => c['qom-path'])).toContain('/machine/peripheral/cpu-1');
    await qmp.objectAdd({ 'qom-type': 'memory-backend-ram', id: 'mem-extra', size: 128 * 1024 * 1024 });
    await qmp.deviceAdd({ driver: 'virtserialport', id: 'port-x', bus: 'vser0.0', name: 'org.example.x' });
    const deleted = await qmp.deviceDelAndWait('port-x', 5000);
    expect(deleted.data).toEqual({ device: 'port-x', path: '/machine/peripheral/port-x' });
    await qmp.quit();
    expect(replay.mismatches).toEqual([]);
    expect(replay.finished).toBe(true);
  });

  it('turns QEMU error replies into QmpError with class and desc', async () => {
    const replay = new TranscriptReplay(loadTranscript('errors'), { chunking: 'bytes' });
    const qmp = await QmpClient.open(replay.client);

    const bad = await rejection(qmp.deviceAdd({ driver: 'no-such-driver', id: 'x' }));
    expect(bad).toBeInstanceOf(QmpError);
    expect(bad).toMatchObject({ kind: 'internal', reason: 'QMP_COMMAND_FAILED', command: 'device_add', errorClass: 'GenericError' });
    expect((bad as QmpError).desc).toBe("'no-such-driver' is not a valid device model name");

    expect(await rejection(qmp.deviceDel('missing-device'))).toMatchObject({ kind: 'not_found', errorClass: 'DeviceNotFound' });
    expect(await rejection(qmp.execute('no-such-command'))).toMatchObject({ kind: 'unimplemented', errorClass: 'CommandNotFound' });
    expect(await rejection(qmp.qomGet('/machine', 'no-such-property'))).toMatchObject({ errorClass: 'GenericError' });
    const missing = await rejection(qmp.objectAdd({ 'qom-type': 'memory-backend-ram', id: 'm' }));
    expect((missing as QmpError).desc).toBe("Parameter 'size' is missing");
    // The connection is still usable after errors.
    await qmp.quit();
    expect(replay.mismatches).toEqual([]);
    expect(replay.finished).toBe(true);
  });
});

// The following conversations cannot be provoked from a healthy QEMU (no reply at all, a socket
// dying mid-command), so they are hand-built from recorded lines.
const greeting = loadTranscript('lifecycle').slice(0, 3);

describe('QmpClient failure handling (hand-built from recorded lines)', () => {
  it('times a command out and ignores its late reply', async () => {
    const replay = new TranscriptReplay([
      ...greeting,
      { dir: 'send', line: '{"execute":"query-status","id":2}' },
      // no reply to id 2 until the next command is sent
      { dir: 'send', line: '{"execute":"query-status","id":3}' },
      { dir: 'recv', line: '{"return": {"status": "late", "running": false}, "id": 2}' },
      { dir: 'recv', line: '{"return": {"status": "prelaunch", "running": false}, "id": 3}' },
    ]);
    const qmp = await QmpClient.open(replay.client);
    const timedOut = await rejection(qmp.queryStatus({ timeoutMs: 30 }));
    expect(timedOut).toMatchObject({ kind: 'timeout', reason: 'QMP_TIMEOUT' });
    expect((await qmp.queryStatus()).status).toBe('prelaunch');
    expect(replay.mismatches).toEqual([]);
    qmp.close();
  });

  it('fails every pending command and event wait at once when the socket closes', async () => {
    const replay = new TranscriptReplay([
      ...greeting,
      { dir: 'send', line: '{"execute":"query-status","id":2}' },
      { dir: 'send', line: '{"execute":"query-pci","id":3}' },
      { dir: 'send', line: '{"execute":"query-cpus-fast","id":4}' },
      { dir: 'close' },
    ]);
    const qmp = await QmpClient.open(replay.client);
    const event = qmp.waitForEvent('SHUTDOWN', undefined, 60_000);
    const results = await Promise.allSettled([qmp.queryStatus(), qmp.queryPci(), qmp.queryCpusFast(), event]);
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect((r as PromiseRejectedResult).reason).toMatchObject({ kind: 'unavailable', reason: 'QMP_CLOSED' });
    }
    expect(qmp.isClosed).toBe(true);
    await qmp.closed;
    // Commands after the close fail immediately, without writing.
    expect(await rejection(qmp.cont())).toMatchObject({ reason: 'QMP_CLOSED' });
    expect(replay.sent).toHaveLength(4);
  });

  it('attributes an id-less error (QEMU could not parse the line) to the oldest pending command', async () => {
    const replay = new TranscriptReplay([
      ...greeting,
      { dir: 'send', line: '{"execute":"query-status","id":2}' },
      { dir: 'recv', line: '{"error": {"class": "GenericError", "desc": "JSON parse error, invalid keyword \'x\'"}}' },
    ]);
    const qmp = await QmpClient.open(replay.client);
    expect(await rejection(qmp.queryStatus())).toMatchObject({ errorClass: 'GenericError', command: 'query-status' });
    qmp.close();
  });

  it('decodes multi-byte characters split across chunks and keeps listeners isolated', async () => {
    const replay = new TranscriptReplay(
      [
        ...greeting,
        { dir: 'send', line: '{"execute":"query-status","id":2}' },
        { dir: 'recv', line: '{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "X_NOTE", "data": {"text": "Größe ✓"}}' },
        { dir: 'recv', line: 'not json at all' },
        { dir: 'recv', line: '{"return": {"status": "prelaunch", "running": false}, "id": 2}' },
      ],
      { chunking: 'bytes' },
    );
    const qmp = await QmpClient.open(replay.client);
    const seen: QmpEvent[] = [];
    qmp.on('X_NOTE', () => {
      throw new Error('a broken listener must not break the client');
    });
    const offOnce = qmp.once('X_NOTE', (e) => seen.push(e));
    expect((await qmp.queryStatus()).status).toBe('prelaunch');
    expect(seen.map((e) => e.data?.text)).toEqual(['Größe ✓']);
    offOnce();
    qmp.close();
  });

  it('rejects an event wait that times out', async () => {
    const replay = new TranscriptReplay(greeting);
    const qmp = await QmpClient.open(replay.client);
    expect(await rejection(qmp.waitForEvent('DEVICE_DELETED', undefined, 20))).toMatchObject({ reason: 'QMP_EVENT_TIMEOUT' });
    qmp.close();
  });

  it('fails to open when the peer closes before the greeting', async () => {
    const replay = new TranscriptReplay(parseTranscript('<- CLOSE\n'));
    expect(await rejection(QmpClient.open(replay.client))).toMatchObject({ reason: 'QMP_CLOSED' });
  });
});
