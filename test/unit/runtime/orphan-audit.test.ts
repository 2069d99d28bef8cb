/** The orphan audit on a fixture state dir, /proc and cgroup tree: what no record owns is named, the rest is not. */
import { link, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { auditOrphans, ownersFromRecords } from '../../../src/runtime/sandbox/orphan-audit.js';

const A = 'a'.repeat(64);
const B = 'b'.repeat(64);
const C = 'c'.repeat(64);
const D = 'd'.repeat(64);
const E = 'e'.repeat(64);
/** A pooled VM that A claimed: its cgroup in the pool's is A's until the claim removes it. */
const F = 'f'.repeat(64);

describe('auditOrphans', () => {
  let root: string;
  beforeEach(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'kts-orphans-'));
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  async function proc(pid: number, argv: string[]): Promise<void> {
    await mkdir(path.join(root, 'proc', String(pid)), { recursive: true });
    await writeFile(path.join(root, 'proc', String(pid), 'cmdline'), `${argv.join('\0')}\0`);
  }
  async function cgroup(rel: string, procs: string): Promise<void> {
    await mkdir(path.join(root, 'cg', rel), { recursive: true });
    await writeFile(path.join(root, 'cg', rel, 'cgroup.procs'), procs);
  }

  it('names unowned processes, work dirs, mounts, files, root filesystems and cgroups, and nothing owned', async () => {
    const state = path.join(root, 'state');
    const vm = path.join(state, 'vm');
    await mkdir(path.join(vm, A.slice(0, 16)), { recursive: true });
    await mkdir(path.join(vm, B.slice(0, 16)), { recursive: true });
    await writeFile(path.join(vm, 'junk'), '');
    await mkdir(path.join(state, 'rootfs', 'c1'), { recursive: true });
    await mkdir(path.join(state, 'rootfs', 'gone'), { recursive: true });
    await mkdir(path.join(state, 'logs'), { recursive: true });
    await writeFile(path.join(state, 'logs', 'gone.json'), '{}');
    await writeFile(path.join(state, 'logs', 'c1.json'), '{}');
    await mkdir(path.join(state, 'sandboxes'), { recursive: true });
    await writeFile(
      path.join(state, 'sandboxes', `${A}.json`),
      JSON.stringify({
        record: { vmm: { pid: 100 }, virtiofsd: null, network: { netnsName: `kata-ts-${A.slice(0, 16)}` }, origin: { poolVmId: F } },
      }),
    );
    // Pinned pod namespaces: A's (recorded), B's (no record), another daemon's (a QEMU of another
    // state dir runs in it: the same inode as its /proc/<pid>/ns/net), and one not of kata-ts.
    const netns = path.join(root, 'netns');
    await mkdir(netns);
    for (const n of [A, B, C]) await writeFile(path.join(netns, `kata-ts-${n.slice(0, 16)}`), '');
    await writeFile(path.join(netns, 'cni-1234'), '');
    await mkdir(path.join(state, 'containers'), { recursive: true });
    await writeFile(path.join(state, 'containers', 'c1.json'), '{}');

    await proc(100, ['/usr/bin/qemu-system-x86_64', '-qmp', `unix:path=${vm}/${A.slice(0, 16)}/qmp.sock,server=on`]);
    await proc(101, ['qemu-system-x86_64', '-chardev', `socket,id=r,path=${vm}/${A.slice(0, 16)}/ready.sock`]);
    await proc(102, ['/usr/lib/qemu/virtiofsd', `--socket-path=${vm}/${B.slice(0, 16)}/vfs.sock`]);
    await proc(103, ['bash', `${vm}/${B.slice(0, 16)}`]);
    // virtiofsd's sandbox=namespace child of the recorded virtiofsd is owned through its parent.
    await proc(104, ['/usr/lib/qemu/virtiofsd', `--socket-path=${vm}/${A.slice(0, 16)}/vfs.sock`]);
    // A whole stat line (to field 24): the shared reader refuses a line cut short, as no kernel writes one.
    await writeFile(
      path.join(root, 'proc', '104', 'stat'),
      '104 (virtiofsd) S 100 104 104 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 1 0 555 123456 789\n',
    );
    await proc(105, ['qemu-system-x86_64', '-qmp', 'unix:path=/var/lib/other-kata-ts/vm/cccc/qmp.sock']);
    await mkdir(path.join(root, 'proc', '105', 'ns'));
    await link(path.join(netns, `kata-ts-${C.slice(0, 16)}`), path.join(root, 'proc', '105', 'ns', 'net'));
    await mkdir(path.join(root, 'proc', 'self'), { recursive: true });

    await cgroup('', '1\n');
    await cgroup(`kubepods/kata-ts-${A}`, '100\n');
    await cgroup(`kubepods/kata-ts-${C}`, '');
    await cgroup(`kubepods/kata-ts-${D}`, '999\n');
    await cgroup(`kata-ts-${E}.scope`, '102\n');
    await cgroup(`kata-ts-pool/kata-ts-${F}`, '');

    const line = (point: string) => `36 25 0:32 / ${point.replaceAll(' ', '\\040')} rw - tmpfs tmpfs rw`;
    const mountinfo = [
      // The state dir's own disk (a tmpfs, a volume): not an orphan.
      line(state),
      line(`${vm}/${A.slice(0, 16)}/shared`),
      line(`${vm}/${A.slice(0, 16)}/shared/containers/c1/rootfs`),
      line(`${vm}/${B.slice(0, 16)}/shared`),
      // A confined VMM's jail: itself, its /usr and the VMM dir at its own path inside.
      line(`${vm}/${A.slice(0, 16)}/jail`),
      line(`${vm}/${A.slice(0, 16)}/jail/usr`),
      line(`${vm}/${A.slice(0, 16)}/jail${vm}/${A.slice(0, 16)}/vmm`),
      line(`${vm}/${B.slice(0, 16)}/jail/usr`),
      line('/elsewhere'),
    ].join('\n');

    const owners = await ownersFromRecords(state);
    expect(owners).toEqual({
      sandboxes: [
        { id: F, pids: [] },
        { id: A, pids: [100] },
      ],
      containerIds: ['c1'],
      netnsNames: [`kata-ts-${A.slice(0, 16)}`],
    });
    const orphans = await auditOrphans(owners, {
      stateDir: state,
      procRoot: path.join(root, 'proc'),
      mountinfo,
      cgroupRoot: path.join(root, 'cg'),
      netnsDir: netns,
    });
    const named = orphans.map((o) => `${o.kind} ${path.relative(root, o.path)}${o.pid === undefined ? '' : ` ${o.pid}`}`).sort();
    expect(named).toEqual(
      [
        `qemu state/vm/${A.slice(0, 16)} 101`,
        `virtiofsd state/vm/${B.slice(0, 16)} 102`,
        `workdir state/vm/${B.slice(0, 16)}`,
        'file state/vm/junk',
        `mount state/vm/${B.slice(0, 16)}/shared`,
        `mount state/vm/${B.slice(0, 16)}/jail/usr`,
        'rootfs state/rootfs/gone',
        'file state/logs/gone.json',
        `netns netns/kata-ts-${B.slice(0, 16)}`,
        `cgroup cg/kubepods/kata-ts-${C}`,
        `cgroup cg/kata-ts-${E}.scope`,
      ].sort(),
    );
    // A test or bench judges only its own pods' namespaces: B's is another run's leftover to it.
    const opts = { stateDir: state, procRoot: path.join(root, 'proc'), mountinfo, netnsDir: netns };
    const netnsOf = async (scope: string[]) =>
      (await auditOrphans(owners, { ...opts, netnsScope: scope })).filter((o) => o.kind === 'netns').map((o) => path.basename(o.path));
    expect(await netnsOf([`kata-ts-${A.slice(0, 16)}`, `kata-ts-${C.slice(0, 16)}`])).toEqual([]);
    expect(await netnsOf([`kata-ts-${B.slice(0, 16)}`])).toEqual([`kata-ts-${B.slice(0, 16)}`]);
  });

  it('finds nothing in an empty or missing state dir', async () => {
    const state = path.join(root, 'none');
    await mkdir(path.join(root, 'proc', 'self'), { recursive: true });
    expect(
      await auditOrphans(await ownersFromRecords(state), { stateDir: state, procRoot: path.join(root, 'proc'), mountinfo: '' }),
    ).toEqual([]);
  });
});
