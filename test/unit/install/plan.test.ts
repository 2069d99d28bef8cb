/**
 * The containerd installer's planner (pure): per containerd release and config schema, where the
 * handlers go, that everything else stays byte for byte, idempotency, refusals, and that an
 * uninstall planned from the record gives back the original bytes. Plans are applied to an
 * in-memory file map here; test/unit/install/execute.test.ts runs the executor on real files.
 */

import { parse } from 'smol-toml';
import { describe, expect, it } from 'vitest';
import { isKataError } from '../../../src/common/errors.js';
import {
  type ContainerdVersion,
  type InstallPlan,
  type InstallRecord,
  parseContainerdVersion,
  planInstall,
  planUninstall,
} from '../../../src/install/index.js';
import { dropInTarget } from '../../../src/install/plan.js';

const CONFIG = '/etc/containerd/config.toml';
const STATE = `${CONFIG}.kata-ts-install.json`;
const BACKUP = `${CONFIG}.kata-ts-backup`;
const V1_6 = parseContainerdVersion('containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3');
const V1_7 = parseContainerdVersion('containerd containerd.io v1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da');
const V2_1 = parseContainerdVersion('containerd github.com/containerd/containerd/v2 v2.1.0 cb1076646aa3740577fafbf3d914198b7fe8e3f7');

/** A node's files (path -> text), a directory set, and the planner's inputs read from them. */
class Files {
  readonly files = new Map<string, string>();
  readonly dirs = new Set<string>(['/etc/containerd']);
  constructor(init: Record<string, string> = {}) {
    for (const [k, v] of Object.entries(init)) this.files.set(k, v);
  }
  installInput(version: ContainerdVersion) {
    const text = this.files.get(CONFIG) ?? null;
    const imported = [...this.files.entries()]
      .filter(([p]) => p.startsWith('/etc/containerd/conf.d/') && p.endsWith('.toml'))
      .sort()
      .map(([path, t]) => ({ path, text: t }));
    const record = this.files.has(STATE) ? (JSON.parse(this.files.get(STATE)!) as InstallRecord) : null;
    return {
      configPath: CONFIG,
      configText: text,
      imported: text?.includes('conf.d') ? imported : [],
      existingDirs: [...this.dirs],
      version,
      record,
      statePath: STATE,
      backupPath: BACKUP,
    };
  }
  uninstallInput() {
    const record = this.files.has(STATE) ? (JSON.parse(this.files.get(STATE)!) as InstallRecord) : null;
    const files: Record<string, string | null> = {};
    for (const f of record?.files ?? []) {
      files[f.path] = this.files.get(f.path) ?? null;
      if (f.change === 'edited') files[f.backupPath] = this.files.get(f.backupPath) ?? null;
    }
    return { statePath: STATE, record, files };
  }
  apply(plan: InstallPlan): void {
    for (const c of plan.changes) {
      if (c.op === 'write') this.files.set(c.path, c.text);
      else if (c.op === 'remove') this.files.delete(c.path);
      else if (c.op === 'mkdir') this.dirs.add(c.path);
      else this.dirs.delete(c.path);
    }
  }
  snapshot(): Record<string, string> {
    return Object.fromEntries(this.files);
  }
}

const V2_CONFIG = `version = 2
root = "/var/lib/containerd"

# the node's own runtimes, tables and comments kept as they are
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
    [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.nvidia]
      runtime_type = 'io.containerd.runc.v2'
`;

const V3_CONFIG = `version = 3
root = '/var/lib/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
`;

function reason(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (isKataError(err)) return `${err.kind} ${err.reason}: ${err.message}`;
    throw err;
  }
  throw new Error('expected a refusal');
}

// biome-ignore lint/suspicious/noExplicitAny: decoded TOML, read by key path in assertions only
type Doc = Record<string, any>;
const runtimesV2 = (text: string): Doc => (parse(text) as Doc).plugins['io.containerd.grpc.v1.cri'].containerd.runtimes;
const runtimesV3 = (text: string): Doc => (parse(text) as Doc).plugins['io.containerd.cri.v1.runtime'].containerd.runtimes;

describe('containerd version', () => {
  it.each([
    ['containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3', '1.6.20'],
    ['containerd containerd.io v1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da', '1.7.27'],
    ['containerd github.com/containerd/containerd/v2 v2.1.0 cb10766', '2.1.0'],
    ['2.0.5', '2.0.5'],
    ['v1.6.0-rc.1', '1.6.0'],
  ])('%s -> %s', (text, want) => {
    const v = parseContainerdVersion(text);
    expect(`${v.major}.${v.minor}.${v.patch}`).toBe(want);
  });

  it('refuses text without a version, naming it', () => {
    expect(reason(() => parseContainerdVersion('containerd: command not found'))).toMatch(/^invalid CONTAINERD_VERSION_UNPARSABLE/);
  });

  it.each(['1.5.18', '1.4.0', '3.0.0', '0.2.0'])('refuses containerd %s with FAILED_PRECONDITION', (v) => {
    expect(reason(() => planInstall(new Files({ [CONFIG]: V2_CONFIG }).installInput(parseContainerdVersion(v))))).toBe(
      `precondition CONTAINERD_VERSION_UNSUPPORTED: containerd ${v} is not supported: kata-ts's shim and installer support containerd 1.6, 1.7 and 2.x`,
    );
  });
});

describe('install into a version 2 config (containerd 1.6 / 1.7)', () => {
  it('1.6: appends one marked block after a backup; everything before it byte for byte; other runtimes kept', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    const plan = planInstall(node.installInput(V1_6));
    expect(plan.changes.map((c) => `${c.op} ${c.path}`)).toEqual([`write ${BACKUP}`, `write ${STATE}`, `write ${CONFIG}`]);
    expect(plan.summary).toEqual([
      `backed up ${CONFIG} to ${BACKUP}`,
      `appended to ${CONFIG} (version 2, everything else unchanged): [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts], [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts-cvm]`,
      `recorded the install in ${STATE}`,
    ]);
    node.apply(plan);
    const after = node.files.get(CONFIG)!;
    expect(after.startsWith(V2_CONFIG)).toBe(true);
    expect(node.files.get(BACKUP)).toBe(V2_CONFIG);
    const runtimes = runtimesV2(after);
    expect(Object.keys(runtimes)).toEqual(['runc', 'nvidia', 'kata-ts', 'kata-ts-cvm']);
    expect(runtimes.runc).toEqual({ runtime_type: 'io.containerd.runc.v2', options: { SystemdCgroup: true } });
    expect(runtimes['kata-ts']).toEqual({
      runtime_type: 'io.containerd.kata-ts.v2',
      pod_annotations: ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*', 'cdi.k8s.io/*'],
      container_annotations: ['io.katacontainers.*', 'kata-ts.dev/*'],
      privileged_without_host_devices: true,
    });
    expect(runtimes['kata-ts-cvm'].runtime_type).toBe('io.containerd.kata-ts-cvm.v2');
    expect((parse(after) as Doc).plugins['io.containerd.grpc.v1.cri'].sandbox_image).toBe('registry.k8s.io/pause:3.6');
  });

  it('1.7: the same, with sandbox_mode = "podsandbox"', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_7)));
    expect(runtimesV2(node.files.get(CONFIG)!)['kata-ts']).toMatchObject({ sandbox_mode: 'podsandbox' });
  });

  it('1.6 never writes a drop-in, even where the config imports a directory (1.x replaces a whole plugin section)', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V2_CONFIG}`;
    const node = new Files({ [CONFIG]: text });
    const plan = planInstall(node.installInput(V1_6));
    expect(plan.record?.method).toBe('edit');
    expect(plan.changes.some((c) => c.path.includes('conf.d'))).toBe(false);
  });

  it('refuses where an imported file replaces the CRI section (1.x), naming that file', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V2_CONFIG}`;
    const node = new Files({
      [CONFIG]: text,
      '/etc/containerd/conf.d/20-mirror.toml':
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n',
    });
    expect(reason(() => planInstall(node.installInput(V1_6)))).toMatch(
      /^precondition CONTAINERD_CONFIG_NOT_EXTENSIBLE: \/etc\/containerd\/conf.d\/20-mirror.toml \(imported by \/etc\/containerd\/config.toml\) replaces the whole/,
    );
    // containerd 2.x merges tables: the same import is no obstacle there.
    expect(planInstall(node.installInput(V2_1)).record?.method).toBe('edit');
  });

  it('a file without a trailing newline gets one before the block; uninstall takes it out again', () => {
    const text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"';
    const node = new Files({ [CONFIG]: text });
    node.apply(planInstall(node.installInput(V1_6)));
    expect(node.files.get(CONFIG)!.startsWith(`${text}\n\n# >>> kata-ts`)).toBe(true);
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: text });
  });

  it('an empty (or comments-only) config gets `version = 2` inside the block', () => {
    const node = new Files({ [CONFIG]: '# managed by hand\n' });
    node.apply(planInstall(node.installInput(V1_6)));
    const after = node.files.get(CONFIG)!;
    expect((parse(after) as Doc).version).toBe(2);
    expect(runtimesV2(after)['kata-ts'].runtime_type).toBe('io.containerd.kata-ts.v2');
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: '# managed by hand\n' });
  });

  it('no config at all: creates one with version 2 and the handlers; uninstall removes it', () => {
    const node = new Files();
    const plan = planInstall(node.installInput(V1_6));
    expect(plan.summary[0]).toBe(
      `created ${CONFIG} (version 2): [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts], [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts-cvm]`,
    );
    node.apply(plan);
    expect((parse(node.files.get(CONFIG)!) as Doc).version).toBe(2);
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({});
  });

  it('refuses a config without `version` (the version 1 layout), naming the key', () => {
    const node = new Files({ [CONFIG]: '[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n' });
    expect(reason(() => planInstall(node.installInput(V1_6)))).toBe(
      `precondition CONTAINERD_CONFIG_VERSION_UNSUPPORTED: ${CONFIG} has no \`version\` key (containerd's version 1 layout); set \`version = 2\` and use that layout, then install again`,
    );
  });

  it('refuses version 3 on containerd 1.7, naming the field and what it reads', () => {
    const node = new Files({ [CONFIG]: V3_CONFIG });
    expect(reason(() => planInstall(node.installInput(V1_7)))).toBe(
      `precondition CONTAINERD_CONFIG_VERSION_UNSUPPORTED: ${CONFIG}: \`version = 3\` is not read by containerd 1.7.27, which reads version 2`,
    );
  });

  it('refuses a config that is not TOML, naming the file and line', () => {
    const node = new Files({ [CONFIG]: 'version = 2\n[plugins\n' });
    expect(reason(() => planInstall(node.installInput(V1_6)))).toMatch(
      new RegExp(`^invalid CONTAINERD_CONFIG_INVALID: ${CONFIG} is not valid TOML \\(line 2, column \\d+\\)$`),
    );
  });

  it('refuses a config whose runtimes are an inline table (appending would break it): nothing changes', () => {
    const text =
      'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }\n';
    const node = new Files({ [CONFIG]: text });
    expect(reason(() => planInstall(node.installInput(V1_6)))).toMatch(
      /^precondition CONTAINERD_CONFIG_NOT_EXTENSIBLE: .*cannot take \[plugins/,
    );
  });
});

describe('install on containerd 2.x', () => {
  it('version 3 with `imports` of conf.d/*.toml: a drop-in of our own, the config untouched', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V3_CONFIG}`;
    const node = new Files({ [CONFIG]: text, '/etc/containerd/conf.d/10-other.toml': 'version = 3\n' });
    node.dirs.add('/etc/containerd/conf.d');
    const plan = planInstall(node.installInput(V2_1));
    expect(plan.changes.map((c) => `${c.op} ${c.path}`)).toEqual([`write ${STATE}`, 'write /etc/containerd/conf.d/kata-ts.toml']);
    expect(plan.summary[0]).toBe(
      `wrote drop-in /etc/containerd/conf.d/kata-ts.toml (imported by ${CONFIG}): [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata-ts], [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata-ts-cvm]`,
    );
    node.apply(plan);
    expect(node.files.get(CONFIG)).toBe(text);
    const dropIn = node.files.get('/etc/containerd/conf.d/kata-ts.toml')!;
    expect((parse(dropIn) as Doc).version).toBe(3);
    expect(runtimesV3(dropIn)['kata-ts']).toEqual({
      runtime_type: 'io.containerd.kata-ts.v2',
      pod_annotations: ['io.katacontainers.*', 'kata-ts.dev/*', 'io.kata-ts.*', 'cdi.k8s.io/*'],
      container_annotations: ['io.katacontainers.*', 'kata-ts.dev/*'],
      privileged_without_host_devices: true,
      sandboxer: 'podsandbox',
    });
    // Idempotent, then undone exactly.
    expect(planInstall(node.installInput(V2_1)).changes).toEqual([]);
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: text, '/etc/containerd/conf.d/10-other.toml': 'version = 3\n' });
  });

  it('a missing drop-in directory is made, recorded and removed again', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V3_CONFIG}`;
    const node = new Files({ [CONFIG]: text });
    const plan = planInstall(node.installInput(V2_1));
    expect(plan.changes[0]).toEqual({ op: 'mkdir', path: '/etc/containerd/conf.d' });
    node.apply(plan);
    const undo = planUninstall(node.uninstallInput());
    expect(undo.changes.at(-1)).toEqual({ op: 'rmdir', path: '/etc/containerd/conf.d' });
    node.apply(undo);
    expect(node.dirs.has('/etc/containerd/conf.d')).toBe(false);
  });

  it('version 3 without imports: the block appended, in the version 3 schema', () => {
    const node = new Files({ [CONFIG]: V3_CONFIG });
    node.apply(planInstall(node.installInput(V2_1)));
    const runtimes = runtimesV3(node.files.get(CONFIG)!);
    expect(Object.keys(runtimes)).toEqual(['runc', 'kata-ts', 'kata-ts-cvm']);
    expect(runtimes['kata-ts-cvm']).toMatchObject({ runtime_type: 'io.containerd.kata-ts-cvm.v2', sandboxer: 'podsandbox' });
  });

  it('a version 2 config under 2.x: edited in the version 2 schema (containerd migrates it), never a drop-in', () => {
    const node = new Files({ [CONFIG]: `imports = ["conf.d/*.toml"]\n${V2_CONFIG}` });
    const plan = planInstall(node.installInput(V2_1));
    expect(plan.record?.method).toBe('edit');
    node.apply(plan);
    expect(runtimesV2(node.files.get(CONFIG)!)['kata-ts']).toMatchObject({ sandbox_mode: 'podsandbox' });
  });

  it('--sandboxer shim: the Sandbox API in both tables (v3 drop-in and v2 edit), idempotent, undone exactly', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V3_CONFIG}`;
    const node = new Files({ [CONFIG]: text });
    node.dirs.add('/etc/containerd/conf.d');
    node.apply(planInstall({ ...node.installInput(V2_1), sandboxer: 'shim' }));
    const dropIn = runtimesV3(node.files.get('/etc/containerd/conf.d/kata-ts.toml')!);
    expect(dropIn['kata-ts']).toMatchObject({ sandboxer: 'shim' });
    expect(dropIn['kata-ts-cvm']).toMatchObject({ sandboxer: 'shim' });
    expect(planInstall({ ...node.installInput(V2_1), sandboxer: 'shim' }).changes).toEqual([]);
    // Installed with shim, asked again with podsandbox: our own file no longer reads as asked.
    expect(() => planInstall({ ...node.installInput(V2_1), sandboxer: 'podsandbox' })).toThrow();
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: text });

    const v2 = new Files({ [CONFIG]: V2_CONFIG });
    v2.apply(planInstall({ ...v2.installInput(V2_1), sandboxer: 'shim' }));
    expect(runtimesV2(v2.files.get(CONFIG)!)['kata-ts']).toMatchObject({ sandbox_mode: 'shim' });
  });

  it('--sandboxer shim on containerd 1.x is refused, nothing planned', () => {
    for (const v of [V1_6, V1_7]) {
      const node = new Files({ [CONFIG]: V2_CONFIG });
      expect(reason(() => planInstall({ ...node.installInput(v), sandboxer: 'shim' }))).toMatch(
        /^invalid INSTALL_SANDBOXER_UNSUPPORTED: --sandboxer shim needs containerd 2.x/,
      );
      expect(node.snapshot()).toEqual({ [CONFIG]: V2_CONFIG });
    }
  });

  it('no config on 2.x: created with version 3', () => {
    const node = new Files();
    node.apply(planInstall(node.installInput(V2_1)));
    expect(runtimesV3(node.files.get(CONFIG)!)['kata-ts'].runtime_type).toBe('io.containerd.kata-ts.v2');
  });

  it('refuses a drop-in path someone else already uses', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V3_CONFIG}`;
    const node = new Files({ [CONFIG]: text, '/etc/containerd/conf.d/kata-ts.toml': 'version = 3\n' });
    expect(reason(() => planInstall(node.installInput(V2_1)))).toBe(
      'precondition INSTALL_FILE_EXISTS: /etc/containerd/conf.d/kata-ts.toml exists and was not written by kata-ts; remove it or install by editing the config',
    );
  });

  it('drop-in targets: relative globs resolve against the config, patterns without one `*` in the name are skipped', () => {
    expect(dropInTarget(CONFIG, ['conf.d/*.toml'])).toEqual({ dir: '/etc/containerd/conf.d', file: '/etc/containerd/conf.d/kata-ts.toml' });
    expect(dropInTarget(CONFIG, ['/etc/x.toml', '/a/*/b.toml', '/d/??.toml', '/d/10-*-x.toml'])).toEqual({
      dir: '/d',
      file: '/d/10-kata-ts-x.toml',
    });
    expect(dropInTarget(CONFIG, [])).toBeNull();
  });
});

describe('idempotency, conflicts, uninstall', () => {
  it('a second install changes nothing and says so; uninstall gives back the original bytes; a second uninstall does nothing', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_6)));
    const again = planInstall(node.installInput(V1_6));
    expect(again.changes).toEqual([]);
    expect(again.summary).toEqual([`already installed (${STATE}): ${CONFIG}; nothing changed`]);
    const undo = planUninstall(node.uninstallInput());
    expect(undo.summary).toEqual([
      `restored ${CONFIG} from ${BACKUP} (byte for byte as before install)`,
      `removed the backup ${BACKUP}`,
      `removed the install record ${STATE}`,
    ]);
    node.apply(undo);
    expect(node.snapshot()).toEqual({ [CONFIG]: V2_CONFIG });
    const twice = planUninstall(node.uninstallInput());
    expect(twice.changes).toEqual([]);
    expect(twice.summary).toEqual([`no install recorded at ${STATE}: nothing changed`]);
  });

  it('edits made after install are kept: uninstall removes exactly the block', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_6)));
    node.files.set(CONFIG, node.files.get(CONFIG)!.replace('root = "/var/lib/containerd"', 'root = "/data/containerd"'));
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: V2_CONFIG.replace('root = "/var/lib/containerd"', 'root = "/data/containerd"') });
  });

  it('refuses to uninstall when the block was edited, naming the file and the backup', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_6)));
    node.files.set(CONFIG, node.files.get(CONFIG)!.replace('cdi.k8s.io/*', 'other/*'));
    expect(reason(() => planUninstall(node.uninstallInput()))).toMatch(
      new RegExp(
        `^precondition INSTALL_FILE_CHANGED: ${CONFIG} no longer holds the block kata-ts appended .*restore it from ${BACKUP} by hand$`,
      ),
    );
  });

  it('refuses a handler already defined differently, naming the table', () => {
    const text = `${V2_CONFIG}    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts]\n      runtime_type = "io.containerd.kata.v2"\n`;
    const node = new Files({ [CONFIG]: text });
    expect(reason(() => planInstall(node.installInput(V1_6)))).toBe(
      `precondition INSTALL_HANDLER_CONFLICT: ${CONFIG} already defines [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-ts] differently, not written by kata-ts; remove or rename that table first`,
    );
  });

  it('refuses a handler defined differently in an imported file (2.x), naming that file', () => {
    const text = `imports = ["/etc/containerd/conf.d/*.toml"]\n${V3_CONFIG}`;
    const other = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kata-ts-cvm]\n  runtime_type = 'x'\n";
    const node = new Files({ [CONFIG]: text, '/etc/containerd/conf.d/50-vendor.toml': other });
    expect(reason(() => planInstall(node.installInput(V2_1)))).toMatch(
      /^precondition INSTALL_HANDLER_CONFLICT: \/etc\/containerd\/conf.d\/50-vendor.toml already defines \[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata-ts-cvm\] differently/,
    );
  });

  it('both handlers already configured exactly as kata-ts would, by someone else: nothing to do, nothing recorded', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_6)));
    const configured = node.files.get(CONFIG)!;
    const hand = new Files({ [CONFIG]: configured });
    const plan = planInstall(hand.installInput(V1_6));
    expect(plan.changes).toEqual([]);
    expect(plan.record).toBeNull();
    expect(plan.summary[0]).toMatch(/already configured as kata-ts would, not by kata-ts: nothing changed/);
  });

  it('a record whose handlers are gone is refused as stale', () => {
    const node = new Files({ [CONFIG]: V2_CONFIG });
    node.apply(planInstall(node.installInput(V1_6)));
    node.files.set(CONFIG, V2_CONFIG);
    expect(reason(() => planInstall(node.installInput(V1_6)))).toMatch(/^precondition INSTALL_STATE_STALE: /);
    // ... and uninstall sees the original text already there: it removes backup and record only.
    node.apply(planUninstall(node.uninstallInput()));
    expect(node.snapshot()).toEqual({ [CONFIG]: V2_CONFIG });
  });

  it('a created file changed since is refused on uninstall', () => {
    const node = new Files();
    node.apply(planInstall(node.installInput(V1_6)));
    node.files.set(CONFIG, `${node.files.get(CONFIG)}\n[grpc]\n`);
    expect(reason(() => planUninstall(node.uninstallInput()))).toMatch(
      /^precondition INSTALL_FILE_CHANGED: \/etc\/containerd\/config.toml was changed since kata-ts created it/,
    );
  });
});
