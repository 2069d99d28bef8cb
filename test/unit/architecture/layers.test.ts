/**
 * The layering docs/architecture.md describes, held by reading every import of
 * src/ and guest/. Lowest first: common <- config <- sizing/pcie <- hypervisor and the other
 * drivers <- the core (src/runtime: its root files, spec, admission and logs <- sandbox <- resize
 * <- container) <- the faces (src/cri, src/shim) <- the composition root (src/daemon) <- cli. Every folder
 * has a row; a new folder, an arrow the other way, or a circle of files fails here.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../../src/common/paths.js';
import {
  findCycles,
  folders,
  importGraph,
  importSpecifiers,
  type LayerTable,
  layerTableCycles,
  layerViolations,
  sourceFiles,
  staleFolderRows,
  unplacedFolders,
} from './import-graph.js';

const ROOT = packageRoot();
const GENERATED = path.join(ROOT, 'src', 'generated');

/** Drivers and pure planners under the core: what any floor of the core may use. */
const BELOW_CORE = [
  'common',
  'config',
  'generated',
  'sizing',
  'pcie',
  'hypervisor',
  'cgroups',
  'images',
  'oci',
  'network',
  'agent-client',
  'channel',
  'measure',
  'tpm',
  'attest',
];
/** The core's lowest floor: its root files (context, deadline, locks, store, facts, metrics, plan, ...). */
const CORE_BASE = ['core-root', 'spec', 'admission', 'logs'];
const CORE = [...CORE_BASE, 'sandbox', 'resize', 'pool', 'template', 'container'];

const LAYERS: LayerTable = {
  folders: {
    src: 'src-root',
    'src/common': 'common',
    'src/generated': 'generated',
    'src/generated/agent': 'generated',
    'src/generated/containerd': 'generated',
    'src/generated/runtime': 'generated',
    'src/generated/runtime/v1': 'generated',
    'src/config': 'config',
    'src/sizing': 'sizing',
    'src/pcie': 'pcie',
    'src/manifest': 'manifest',
    'src/cgroups': 'cgroups',
    'src/images': 'images',
    'src/images/registry': 'images',
    'src/images/store': 'images',
    'src/oci': 'oci',
    'src/hypervisor': 'hypervisor',
    'src/hypervisor/qmp': 'hypervisor',
    'src/measure': 'measure',
    'src/tpm': 'tpm',
    'src/attest': 'attest',
    'src/broker': 'broker',
    'src/channel': 'channel',
    'src/network': 'network',
    'src/agent-client': 'agent-client',
    'src/spdy': 'spdy',
    'src/ttrpc': 'ttrpc',
    'src/release': 'release',
    'src/runtime': 'core-root',
    'src/runtime/spec': 'spec',
    'src/runtime/admission': 'admission',
    'src/runtime/logs': 'logs',
    'src/runtime/sandbox': 'sandbox',
    'src/runtime/resize': 'resize',
    'src/runtime/pool': 'pool',
    'src/runtime/template': 'template',
    'src/runtime/container': 'container',
    'src/cri': 'cri',
    'src/cri/decode': 'cri',
    'src/cri/views': 'cri',
    'src/cri/streaming': 'cri',
    'src/shim': 'shim',
    'src/shim/decode': 'shim',
    'src/daemon': 'daemon',
    'src/install': 'install',
    'src/cli': 'cli',
    'src/cli/plan': 'cli',
    guest: 'guest-root',
    'guest/native': 'native',
    'guest/agent': 'guest-agent',
    'guest/agent/attest': 'guest-agent',
    'guest/agent/containers': 'guest-containers',
    'guest/agent/containers/native': 'native',
  },
  mayImport: {
    // Folders that hold no TypeScript (src/ itself, guest/ itself, C sources): nothing to import.
    'src-root': [],
    'guest-root': [],
    native: [],
    common: [],
    generated: [],
    config: ['common'],
    sizing: ['common', 'config'],
    pcie: ['common', 'config'],
    manifest: ['common', 'config', 'sizing'],
    cgroups: ['common', 'config'],
    images: ['common', 'config'],
    oci: ['common', 'config', 'generated'],
    hypervisor: ['common', 'config', 'sizing', 'pcie'],
    channel: ['common', 'generated'],
    network: ['common', 'config'],
    'agent-client': ['common', 'channel', 'generated'],
    spdy: ['common'],
    ttrpc: ['common', 'generated'],
    release: ['common'],
    // Launch-measurement prediction: pure, over buffers the caller read.
    measure: ['common'],
    // A pod's swtpm (started through the VMM's jail chain) and the node's EK CA.
    tpm: ['common', 'config', 'hypervisor'],
    // Attestation messages and evidence checks (KBS protocol, JWE, TPM/SNP/TDX): pure, shared by
    // the broker and the guest's attester.
    attest: ['common', 'measure'],
    // The attestation broker (`kata-ts broker`): a process of its own, not the runtime's core.
    broker: ['common', 'config', 'measure', 'attest', 'tpm'],
    // The core, floor by floor.
    'core-root': ['common', 'config', 'generated', 'sizing', 'pcie', 'hypervisor', 'cgroups'],
    spec: ['common', 'generated'],
    admission: ['common', 'config', 'sizing'],
    logs: ['common'],
    sandbox: [...BELOW_CORE, ...CORE_BASE],
    resize: [...BELOW_CORE, ...CORE_BASE, 'sandbox'],
    pool: [...BELOW_CORE, ...CORE_BASE, 'sandbox', 'resize'],
    // VM templates in the runtime: the store, a clone made ready (restore, agent, reseed), its claim
    // by a pod (the pool claim's steps) and the daemon's manager of them.
    template: [...BELOW_CORE, ...CORE_BASE, 'sandbox', 'resize', 'pool'],
    container: [...BELOW_CORE, ...CORE_BASE, 'sandbox', 'resize'],
    // The CRI face: the core and the pure or face-only parts below it, never a driver that
    // touches the host (cgroups, hypervisor, network, pcie): the daemon wires those in.
    cri: ['common', 'config', 'generated', 'images', 'oci', 'agent-client', 'channel', 'spdy', ...CORE],
    // The shim face: the core, the libraries below it and the ttrpc transport; never the CRI
    // face or the daemon (and, below, never @grpc/*).
    shim: [...BELOW_CORE, ...CORE, 'ttrpc', 'release'],
    daemon: [...BELOW_CORE, ...CORE, 'cri', 'spdy'],
    // The containerd installer: config files only, no runtime.
    install: ['common'],
    // ps and metrics read the shims' state and sockets.
    cli: [...BELOW_CORE, ...CORE, 'cri', 'spdy', 'daemon', 'manifest', 'install', 'release', 'shim', 'broker'],
    'guest-agent': ['common', 'channel', 'generated', 'guest-containers', 'measure', 'attest'],
    'guest-containers': ['common', 'generated'],
  },
  exceptions: [
    {
      fromLayer: 'guest-containers',
      file: 'guest/agent/backend.ts',
      why: 'the container backend contract the agent defines and guest/agent/containers implements (types only)',
    },
  ],
};

const folderList = [...folders(path.join(ROOT, 'src')), ...folders(path.join(ROOT, 'guest'))].map((f) =>
  path.relative(ROOT, f).split(path.sep).join('/'),
);
// Generated code is not ours to layer (protobuf types may well refer to each other in circles).
const files = [...sourceFiles(path.join(ROOT, 'src'), new Set([GENERATED])), ...sourceFiles(path.join(ROOT, 'guest'))];
const graph = importGraph(files);

describe('source layering', () => {
  it('finds the source tree and its imports', () => {
    expect(files.length).toBeGreaterThan(100);
    expect([...graph.values()].flat().length).toBeGreaterThan(300);
  });

  it('every folder of src/ and guest/ has a row in the layer table, and every row a folder', () => {
    expect(unplacedFolders(LAYERS, folderList)).toEqual([]);
    expect(staleFolderRows(LAYERS, folderList)).toEqual([]);
  });

  it("every folder of src/ and guest/ has a row in docs/architecture.md's layer table too", () => {
    // The table a reader sees: its first column names folders in backquotes (a row may name two).
    const doc = readFileSync(path.join(ROOT, 'docs', 'architecture.md'), 'utf8');
    const documented = new Set(
      doc
        .split('\n')
        .filter((line) => line.startsWith('| `'))
        .flatMap((line) => [...(line.split('|')[1] ?? '').matchAll(/`([^`]+)`/g)].map((m) => m[1]!.replace(/\/$/, ''))),
    );
    // src/ itself holds no code; the generated folders are one row (`src/generated/`, not in git).
    const undocumented = Object.keys(LAYERS.folders).filter((f) => f !== 'src' && !f.startsWith('src/generated/') && !documented.has(f));
    expect(undocumented).toEqual([]);
  });

  it('every layer named in the table has its own row of what it may import', () => {
    const named = new Set([...Object.values(LAYERS.folders), ...Object.values(LAYERS.mayImport).flat()]);
    expect([...named].filter((l) => LAYERS.mayImport[l] === undefined)).toEqual([]);
  });

  it('the table itself has floors: no layer may import one that may import it back', () => {
    expect(layerTableCycles(LAYERS)).toEqual([]);
  });

  it('every import points down or sideways as the layer table allows', () => {
    expect(layerViolations(graph, ROOT, LAYERS)).toEqual([]);
  });

  it('no file-level import circle, type-only imports included', () => {
    const cycles = findCycles(graph).map((c) => c.map((f) => path.relative(ROOT, f)));
    expect(cycles).toEqual([]);
  });

  it('dbus-next is imported by the systemd driver only, grpc-js by the CRI layer and the kubelet client only', () => {
    const offenders: string[] = [];
    for (const file of files) {
      const rel = path.relative(path.join(ROOT, 'src'), file);
      for (const spec of importSpecifiers(readFileSync(file, 'utf8'))) {
        if (spec === 'dbus-next' && rel !== 'cgroups/systemd.ts') offenders.push(`${rel} imports dbus-next`);
        if (spec.startsWith('@grpc/') && !rel.startsWith('cri/') && rel !== 'pcie/podresources.ts')
          offenders.push(`${rel} imports ${spec}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});
