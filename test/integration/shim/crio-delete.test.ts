/**
 * A CRI-O pod whose shim died: the shim SIGKILLed under a running pod VM (a sandbox and a
 * running container, bundles as CRI-O lays them out, test/helpers/crio-node.ts), then the
 * shim's own cleanup, `<shim> ... -id <id> delete` in each bundle, with CRI-O's command line
 * and environment. CRI-O itself never runs `delete` (runtime_vm.go has no such call: a dead
 * shim leaves its restore unable to connect); containerd does, and this is the cleanup contract
 * the shim owes any caller, here on CRI-O's bundles (a rootfs outside the bundle it must not
 * touch, `-address ""`, cgroupfs `crio-<id>` paths). One pod VM is booted.
 *
 * After it: a DeleteResponse (137) on stdout for each, exit 0 (also when run again), and no
 * QEMU, virtiofsd, mount, cgroup, state dir, socket or TAP is left; the pod's eth0 and CRI-O's
 * mounted image stay as they were.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decodeDeleteResponse } from '../../../src/shim/delete-response.js';
import { connectTtrpc } from '../../../src/ttrpc/index.js';
import { type ContainerBundle, type CrioNode, createCrioNode, type TaskApi } from '../../helpers/crio-node.js';
import { processesMentioning } from '../../helpers/hypervisor-guest.js';
import { until } from '../../helpers/poll.js';
import { cgroupDirsUnder } from '../../helpers/runtime-daemon.js';
import { scaledMs } from '../../helpers/time-scale.js';

const BOOT_MS = scaledMs(240_000);
const LONG = scaledMs(120_000);

describe('a CRI-O pod whose shim was SIGKILLed: `delete` in each bundle leaves nothing (one pod VM)', () => {
  let node: CrioNode;
  let api: TaskApi;
  let container: ContainerBundle;
  let servePid = 0;

  beforeAll(async () => {
    node = await createCrioNode();
  }, LONG);

  afterAll(async () => {
    await node?.cleanup();
  }, LONG);

  it(
    'the pod runs: the sandbox task and a running container',
    async () => {
      const started = await node.runShim('start', node.sandboxId, node.sandboxBundle);
      expect(started.code).toBe(0);
      servePid = (JSON.parse(readFileSync(path.join(node.podStateDir, 'shim.json'), 'utf8')) as { pid: number }).pid;
      api = await node.connect(started.stdout.toString());
      await api.call(
        'Create',
        'containerd.task.v2.CreateTaskRequest',
        { id: node.sandboxId, bundle: node.sandboxBundle },
        'containerd.task.v2.CreateTaskResponse',
        BOOT_MS,
      );
      await api.call('Start', 'containerd.task.v2.StartRequest', { id: node.sandboxId }, 'containerd.task.v2.StartResponse');
      container = await node.containerBundle({ name: 'sleeper', args: ['sleep', '1000'] });
      expect((await node.runShim('start', container.id, container.bundle)).code).toBe(0);
      const stdout = await node.fifo(`${container.id}-stdout`);
      await api.call(
        'Create',
        'containerd.task.v2.CreateTaskRequest',
        { id: container.id, bundle: container.bundle, stdout: stdout.path },
        'containerd.task.v2.CreateTaskResponse',
        LONG,
      );
      await api.call('Start', 'containerd.task.v2.StartRequest', { id: container.id }, 'containerd.task.v2.StartResponse', LONG);
      expect(
        (await api.call('State', 'containerd.task.v2.StateRequest', { id: container.id }, 'containerd.task.v2.StateResponse')).status,
      ).toBe('RUNNING');
      expect(processesMentioning(node.podStateDir).length).toBeGreaterThanOrEqual(2);
      expect(await node.netns.exec('pod', ['ip', '-o', 'link', 'show'])).toContain('tap0_kata');
    },
    BOOT_MS + LONG,
  );

  it(
    "the shim SIGKILLed: CRI-O's Wait ends with the connection, its restore cannot connect; `delete` for the container and the sandbox print a DeleteResponse and leave nothing",
    async () => {
      const waiting = api.call('Wait', 'containerd.task.v2.WaitRequest', { id: container.id }, 'containerd.task.v2.WaitResponse', LONG);
      process.kill(servePid, 'SIGKILL');
      await expect(waiting).rejects.toThrow();
      await until('the shim to be gone', async () => (existsSync(`/proc/${servePid}`) ? undefined : true));
      // The pod VM outlives its shim.
      expect(processesMentioning(node.podStateDir).length).toBeGreaterThanOrEqual(2);
      // CRI-O's restore reads <bundle>/address: nothing answers there any more.
      const address = readFileSync(path.join(container.bundle, 'address'), 'utf8').replace(/^unix:\/\//, '');
      await expect(connectTtrpc(address, { timeoutMs: 2_000 })).rejects.toThrow();

      for (const [id, bundle] of [
        [container.id, container.bundle],
        [node.sandboxId, node.sandboxBundle],
      ] as const) {
        const deleted = await node.runShim('delete', id, bundle);
        expect(deleted.code, deleted.stderr).toBe(0);
        const response = decodeDeleteResponse(deleted.stdout);
        expect(response.exitStatus).toBe(137);
        expect(Math.abs(response.exitedAt.getTime() - Date.now())).toBeLessThan(LONG);
      }
      // delete answers within containerd's few seconds; its detached cleanup may still be at work
      // on a loaded machine (and says so on stderr): what it leaves is checked once it is done.
      // Its last step removes the pod's state dir.
      await until('the detached cleanup to finish', async () =>
        processesMentioning(node.stateRoot).length === 0 && !existsSync(node.podStateDir) ? true : undefined,
      );
      expect(existsSync(node.socketPath)).toBe(false);
      expect(await node.mounts()).toEqual([]);
      const cgroups = (await cgroupDirsUnder(node.cgroupRoot)).filter((d) => d.includes(node.sandboxId.slice(0, 16)) || /crio-/.test(d));
      expect(cgroups).toEqual([]);
      expect((await node.netns.exec('pod', ['ip', '-o', 'link', 'show'])).includes('tap0_kata')).toBe(false);
      expect(await node.netns.exec('pod', ['ip', '-4', '-o', 'addr', 'show', 'dev', 'eth0'])).toContain(`inet ${node.netns.podIp}/24`);
      // CRI-O's mounted image is CRI-O's: untouched.
      expect(existsSync(path.join(container.rootfs, 'bin', 'busybox'))).toBe(true);

      // Run again (a retry): nothing there, still a DeleteResponse and exit 0.
      const again = await node.runShim('delete', node.sandboxId, node.sandboxBundle);
      expect(again.code).toBe(0);
      expect(decodeDeleteResponse(again.stdout).exitStatus).toBe(137);
    },
    LONG * 3,
  );
});
