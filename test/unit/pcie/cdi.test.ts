import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultHandlerProfile } from '../../../src/config/defaults.js';
import { cdiNamesFromAnnotations, loadCdiSpecs, parseQualifiedName, planPcieTopology, resolveCdiDevices } from '../../../src/pcie/index.js';
import { thrown } from '../../helpers/kata-error.js';
import { fixtureInventory } from '../../helpers/pcie-golden.js';
import { FIXTURES_DIR } from '../../helpers/pcie-sysfs.js';

const ETC = path.join(FIXTURES_DIR, 'cdi/etc');
const RUN = path.join(FIXTURES_DIR, 'cdi/run');

const tmp: string[] = [];
afterEach(async () => {
  for (const d of tmp.splice(0)) await fsp.rm(d, { recursive: true, force: true });
});
async function specDir(files: Record<string, string>): Promise<string> {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-cdi-'));
  tmp.push(dir);
  for (const [name, text] of Object.entries(files)) await fsp.writeFile(path.join(dir, name), text);
  return dir;
}
const spec = (kind: string, name: string, node: string) =>
  JSON.stringify({ cdiVersion: '0.6.0', kind, devices: [{ name, containerEdits: { deviceNodes: [{ path: node }] } }] });

describe('loadCdiSpecs on fixtures/cdi', () => {
  it('reads JSON and YAML specs, reports the malformed one with its path and keeps the rest', async () => {
    const reg = await loadCdiSpecs([ETC, RUN]);
    expect(reg.specPaths.map((p) => path.relative(FIXTURES_DIR, p))).toEqual([
      'cdi/etc/example-net.json',
      'cdi/etc/mellanox-vf.yaml',
      'cdi/etc/nvidia-hgx.yaml',
      'cdi/etc/nvidia-pgpu.json',
      'cdi/run/example-net.yaml',
    ]);
    expect(reg.warnings).toHaveLength(1);
    expect(reg.warnings[0]!.path).toBe(path.join(ETC, 'broken.yaml'));
    expect(reg.warnings[0]!.problems).toEqual(
      expect.arrayContaining([
        expect.stringContaining('/kind must match pattern'),
        '/devices/0/containerEdits/devicenodes is not a known key',
      ]),
    );
    expect(Object.keys(reg.devices)).toHaveLength(2 + 48 + 9 + 2);
    // The spec's common deviceNodes (the VFIO container) come with every device of that spec.
    expect(reg.devices['nvidia.com/pgpu=0']!.deviceNodes.map((n) => n.path)).toEqual(['/dev/vfio/12', '/dev/vfio/vfio']);
  });

  it('a device in a later (higher-priority) directory overrides the same device earlier', async () => {
    const reg = await loadCdiSpecs([ETC, RUN]);
    expect(reg.devices['example.com/net=nic0']).toMatchObject({
      specPath: path.join(RUN, 'example-net.yaml'),
      deviceNodes: [{ path: '/dev/vfio/40' }],
    });
    const reversed = await loadCdiSpecs([RUN, ETC]);
    expect(reversed.devices['example.com/net=nic0']!.deviceNodes).toEqual([{ path: '/dev/vfio/31' }]);
    // Devices only the lower-priority spec defines stay available.
    expect(reg.devices['example.com/net=fuse']).toBeDefined();
  });

  it('the same device twice at the same priority is a conflict: reported, unusable, other devices fine', async () => {
    const dir = await specDir({ 'a.json': spec('acme.io/x', 'd0', '/dev/vfio/1'), 'b.json': spec('acme.io/x', 'd0', '/dev/vfio/2') });
    const reg = await loadCdiSpecs([dir]);
    expect(reg.conflicts['acme.io/x=d0']).toEqual([path.join(dir, 'a.json'), path.join(dir, 'b.json')]);
    expect(reg.warnings[0]!.problems[0]).toContain('also defined by');
    expect(thrown(() => resolveCdiDevices(reg, [{ name: 'acme.io/x=d0', origin: 't' }]))).toMatchObject({
      kind: 'precondition',
      reason: 'CDI_DEVICE_CONFLICT',
    });
    // A higher-priority directory settles the conflict.
    const over = await specDir({ 'c.json': spec('acme.io/x', 'd0', '/dev/vfio/3') });
    const settled = await loadCdiSpecs([dir, over]);
    expect(settled.devices['acme.io/x=d0']!.deviceNodes).toEqual([{ path: '/dev/vfio/3' }]);
  });

  it('bad JSON, bad YAML, unknown versions and duplicate names are warnings; missing dirs and other files are ignored', async () => {
    const dir = await specDir({
      'a.json': '{"cdiVersion": ',
      'b.yaml': 'kind: [unclosed',
      'c.json': JSON.stringify({ cdiVersion: 'v1', kind: 'a.io/b', devices: [{ name: 'x' }] }),
      'd.json': JSON.stringify({ cdiVersion: '0.5.0', kind: 'a.io/b', devices: [{ name: 'x' }, { name: 'x' }] }),
      'e.json': JSON.stringify({ cdiVersion: '0.5.0', kind: 'a.io/b', devices: [] }),
      'notes.txt': 'not a spec',
    });
    const reg = await loadCdiSpecs(['/nonexistent/cdi', dir]);
    expect(reg.warnings.map((w) => path.basename(w.path))).toEqual(['a.json', 'b.yaml', 'c.json', 'd.json', 'e.json']);
    expect(reg.warnings[0]!.problems[0]).toMatch(/^is not valid JSON/);
    expect(reg.warnings[1]!.problems[0]).toMatch(/^is not valid YAML/);
    expect(reg.warnings[2]!.problems[0]).toContain('/cdiVersion must match pattern');
    expect(reg.warnings[3]!.problems[0]).toBe('/devices defines "x" more than once');
    expect(reg.warnings[4]!.problems[0]).toContain('/devices must NOT have fewer than 1 items');
    expect(reg.devices).toEqual({});
  });
});

describe('CDI names', () => {
  it('parses fully-qualified names and rejects the rest', () => {
    expect(parseQualifiedName('nvidia.com/gpu=0')).toEqual({ vendor: 'nvidia.com', class: 'gpu', device: '0' });
    expect(parseQualifiedName('vendor.com/class=0000:3b:00.2')).toEqual({ vendor: 'vendor.com', class: 'class', device: '0000:3b:00.2' });
    for (const bad of ['gpu=0', 'nvidia.com/gpu', 'nvidia.com/gpu=', 'nvidia.com/a/b=0', 'nvidia.com/gpu=-x'])
      expect(parseQualifiedName(bad), bad).toBeUndefined();
  });

  it('cdi.k8s.io annotations are comma-separated lists; other annotations are ignored', () => {
    expect(
      cdiNamesFromAnnotations({
        'cdi.k8s.io/gpu': 'nvidia.com/pgpu=0, nvidia.com/hgx=gpu1',
        'cdi.k8s.io/net': 'example.com/net=nic0',
        other: 'x.com/y=z',
      }),
    ).toEqual([
      { name: 'nvidia.com/pgpu=0', origin: 'annotation cdi.k8s.io/gpu' },
      { name: 'nvidia.com/hgx=gpu1', origin: 'annotation cdi.k8s.io/gpu' },
      { name: 'example.com/net=nic0', origin: 'annotation cdi.k8s.io/net' },
    ]);
  });

  it('resolves to VFIO requests (group and iommufd nodes), separates non-VFIO devices, refuses unknown names', async () => {
    const reg = await loadCdiSpecs([ETC, RUN]);
    const r = resolveCdiDevices(reg, [
      { name: 'nvidia.com/hgx=nvswitch-all', origin: 'a' },
      { name: 'mellanox.com/vf=vf7', origin: 'b' },
      { name: 'example.com/net=fuse', origin: 'c' },
    ]);
    expect(r.requests.map((q) => q.hostPath)).toEqual([
      '/dev/vfio/30',
      '/dev/vfio/31',
      '/dev/vfio/32',
      '/dev/vfio/33',
      '/dev/vfio/vfio',
      '/dev/vfio/devices/vfio7',
    ]);
    expect(r.requests[0]!.origin).toBe('CDI nvidia.com/hgx=nvswitch-all (a)');
    expect(r.nonVfio).toEqual([{ name: 'example.com/net=fuse', origin: 'c', nodes: ['/dev/fuse'] }]);
    const unknown = thrown(() => resolveCdiDevices(reg, [{ name: 'nvidia.com/pgpu=9', origin: 'annotation cdi.k8s.io/gpu' }]));
    expect(unknown).toMatchObject({ kind: 'not_found', reason: 'CDI_DEVICE_UNKNOWN' });
    expect(unknown.message).toContain(ETC);
    expect(thrown(() => resolveCdiDevices(reg, [{ name: 'gpu0', origin: 'x' }]))).toMatchObject({
      kind: 'invalid',
      reason: 'CDI_NAME_INVALID',
    });
  });

  it('CDI devices plan end to end: nvidia.com/pgpu=0 on gpu-audio brings GPU and audio', async () => {
    const reg = await loadCdiSpecs([ETC, RUN]);
    const { requests } = resolveCdiDevices(reg, [{ name: 'nvidia.com/pgpu=0', origin: 'annotation cdi.k8s.io/gpu' }]);
    const t = planPcieTopology({
      inventory: await fixtureInventory('gpu-audio'),
      devices: requests,
      profile: { ...defaultHandlerProfile().pcie, confidential: false },
    });
    expect(t.functions.map((f) => f.bdf)).toEqual(['0000:01:00.0', '0000:01:00.1']);
    expect(t.groups[0]!.origins).toEqual(['CDI nvidia.com/pgpu=0 (annotation cdi.k8s.io/gpu)']);
  });
});
