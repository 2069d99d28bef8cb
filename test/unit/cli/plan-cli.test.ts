import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runPlanCommand } from '../../../src/cli/plan.js';
import { packageRoot } from '../../../src/common/paths.js';

const PODS = path.join(packageRoot(), 'fixtures', 'pods');
const BIG = ['--host-cpus', '64', '--host-memory-mib', '262144'];

function sink(): { stream: Writable; text: () => string } {
  let text = '';
  const stream = new Writable({
    write(chunk: Buffer | string, _enc, done) {
      text += chunk.toString();
      done();
    },
  });
  return { stream, text: () => text };
}

async function plan(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = sink();
  const err = sink();
  const code = await runPlanCommand(argv, { stdout: out.stream, stderr: err.stream });
  return { code, stdout: out.text(), stderr: err.text() };
}

let dir: string;
let emptyConfig: string;

beforeAll(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kata-ts-plan-'));
  // An explicit config keeps the tests independent of /etc/kata-ts/config.json on the machine.
  emptyConfig = path.join(dir, 'config.json');
  writeFileSync(emptyConfig, '{}');
});

afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

function file(name: string, text: string): string {
  const full = path.join(dir, name);
  writeFileSync(full, text);
  return full;
}

/** The only acceptable failure output: exactly one line. */
function expectOneLine(stderr: string): void {
  expect(stderr.endsWith('\n')).toBe(true);
  expect(stderr.trimEnd().split('\n')).toHaveLength(1);
}

describe('kata-ts plan', () => {
  it('prints usage with --help', async () => {
    const r = await plan('--help');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('Usage: kata-ts plan --request FILE');
  });

  it('prints the JSON keys the issue names, for a manifest and for a proto3 JSON request alike', async () => {
    for (const name of ['web-sidecar.pod.yaml', 'web-sidecar.request.json']) {
      const r = await plan('--request', path.join(PODS, name), '--config', emptyConfig, '--format', 'json', ...BIG);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const json = JSON.parse(r.stdout) as Record<string, unknown>;
      expect(json.handler).toBe('kata-ts');
      expect(json.source).toBe('pod_resources');
      expect(json.vm).toMatchObject({ vcpus: 2, maxVcpus: 6, memoryMiB: 800, maxMemoryMiB: 4896, hugepages: [] });
      // Under TCG the VMM budget also holds QEMU's bounded translation cache (64 MiB by default);
      // the free-page-reporting balloon (on for kata-ts) 1 MiB.
      const tcg = (json.qemu as { accel: { accel: string } }).accel.accel === 'tcg';
      expect(json.host).toMatchObject({ memoryLimitBytes: (896 + (tcg ? 64 : 0) + 1) * 1024 * 1024, cpuQuotaMillicores: 2100 });
      expect(json.vmmOverhead).toMatchObject({ balloonBytes: 1024 * 1024 });
    }
  });

  it('prints a readable table by default', async () => {
    const r = await plan('--request', path.join(PODS, 'hugepages-db.pod.yaml'), '--config', emptyConfig, ...BIG);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('handler  kata-ts');
    expect(r.stdout).toMatch(/vCPUs\s+3 \(hot-plug up to 7\)/);
    expect(r.stdout).toMatch(/hugepages\s+256 x 2Mi, 1 x 1Gi/);
    expect(r.stdout).toMatch(/postgres\s+regular\s+2\s+2\s+4Gi\s+4Gi\s+hugepages-2Mi=512Mi hugepages-1Gi=1Gi/);
  });

  it('lets --handler override the runtimeClassName, and refuses an unknown handler with exit 2', async () => {
    const cvm = await plan(
      '--request',
      path.join(PODS, 'web-sidecar.pod.yaml'),
      '--config',
      emptyConfig,
      '--handler',
      'kata-ts-cvm',
      '--format',
      'json',
      ...BIG,
    );
    expect(cvm.code).toBe(0);
    const json = JSON.parse(cvm.stdout) as {
      handler: string;
      vm: { vcpus: number; maxVcpus: number };
      vmmOverhead: Record<string, unknown>;
      qemu: { argv: string[] };
    };
    expect(json.handler).toBe('kata-ts-cvm');
    expect(json.vm.maxVcpus).toBe(json.vm.vcpus);
    // No free page reporting for a confidential VM: no balloon in the argv or the budget.
    expect(json.vmmOverhead.balloonBytes).toBeUndefined();
    expect(json.qemu.argv.join(' ')).not.toContain('virtio-balloon');

    const unknown = await plan('--request', path.join(PODS, 'web-sidecar.pod.yaml'), '--config', emptyConfig, '--handler', 'gvisor');
    expect(unknown.code).toBe(2);
    expectOneLine(unknown.stderr);
    expect(unknown.stderr).toContain('[HANDLER_UNKNOWN]');
  });

  it('uses handlers from --config', async () => {
    const config = file('small.json', JSON.stringify({ handlers: { small: { vm: { maxVcpus: 2, hotplugVcpus: 1 } } } }));
    const r = await plan('--request', path.join(PODS, 'migration.pod.yaml'), '--config', config, '--handler', 'small', ...BIG);
    expect(r.code).toBe(1);
    expectOneLine(r.stderr);
    expect(r.stderr).toBe(
      'kata-ts plan: pod billing/api-7f9c needs 4 vCPUs (3250m workload + 250m guest overhead) but handler "small" allows at most 2 [SIZING_VCPUS_EXCEED_HANDLER]\n',
    );
  });

  it('shows how QEMU is confined: seccomp, the identity range, the jail; an opted-out handler shows its reason', async () => {
    const confined = await plan('--request', path.join(PODS, 'besteffort.pod.yaml'), '--config', emptyConfig, ...BIG);
    expect(confined.code).toBe(0);
    expect(confined.stdout).toMatch(
      /VMM confinement\n\s+seccomp\s+-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny\n/,
    );
    expect(confined.stdout).toMatch(/identity\s+uid = gid = the first free of 2000000000-2000065535, taken at RunPodSandbox/);
    expect(confined.stdout).toMatch(/privileges\s+no capabilities .*no_new_privs/);
    expect(confined.stdout).toMatch(/jail\s+chroot \/var\/lib\/kata-ts\/vm\/0{16}\/jail: \/usr read only/);
    expect(confined.stdout).toContain('-sandbox on,obsolete=deny');
    expect(confined.stdout).toContain('path=/var/lib/kata-ts/vm/0000000000000000/vmm/qmp.sock,');

    const config = file(
      'root.json',
      JSON.stringify({
        handlers: { 'kata-ts-root': { vmmConfinement: { seccomp: false, unprivileged: false, optOutReason: 'gdb on QEMU' } } },
      }),
    );
    const root = await plan('--request', path.join(PODS, 'besteffort.pod.yaml'), '--config', config, '--handler', 'kata-ts-root', ...BIG);
    expect(root.code).toBe(0);
    expect(root.stdout).toMatch(/seccomp\s+off \(no -sandbox\): gdb on QEMU/);
    expect(root.stdout).toMatch(/identity\s+off \(QEMU runs as root with every capability\): gdb on QEMU/);
    expect(root.stdout).not.toContain('-sandbox on');
    expect(root.stdout).toContain('path=/var/lib/kata-ts/vm/0000000000000000/qmp.sock,');
    const json = JSON.parse(
      (
        await plan(
          '--request',
          path.join(PODS, 'besteffort.pod.yaml'),
          '--config',
          config,
          '--handler',
          'kata-ts-root',
          '--format',
          'json',
          ...BIG,
        )
      ).stdout,
    );
    expect(json.vmm).toEqual({
      seccomp: null,
      unprivileged: false,
      identityRange: null,
      optOutReason: 'gdb on QEMU',
      leaseDir: null,
      jailDir: null,
      vmmDir: null,
    });
  });

  it('exits 1 with the numbers when the pod does not fit the host', async () => {
    const r = await plan('--request', path.join(PODS, 'migration.pod.yaml'), '--config', emptyConfig, '--host-cpus', '2');
    expect(r.code).toBe(1);
    expectOneLine(r.stderr);
    expect(r.stderr).toContain('needs 4 vCPUs');
    expect(r.stderr).toContain('this host has 2 CPUs [SIZING_VCPUS_EXCEED_HOST]');
    expect(r.stdout).toBe('');
  });

  it.each([
    ['no --request', [], '--request FILE is required'],
    ['an unknown option', ['--request', 'x', '--frobnicate'], 'frobnicate'],
    ['a bad --format', ['--request', 'x', '--format', 'yaml'], '--format must be text or json'],
    ['a bad --host-cpus', ['--request', 'x', '--host-cpus', '0'], '--host-cpus must be a positive integer'],
  ])('exits 2 on usage mistakes: %s', async (_name, argv, message) => {
    const r = await plan(...argv);
    expect(r.code).toBe(2);
    expectOneLine(r.stderr);
    expect(r.stderr).toContain(message);
  });

  it.each<[string, string, string]>([
    ['a missing file', '', 'no such file'],
    ['YAML that does not parse', 'kind: Pod\nspec: [unclosed\n', 'is not valid YAML or JSON at line'],
    ['two documents', 'kind: Pod\n---\nkind: Pod\n', 'holds 2 documents'],
    ['a Deployment', 'apiVersion: apps/v1\nkind: Deployment\n', 'kind is "Deployment"; only a Pod can be planned'],
    [
      'a malformed quantity',
      'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    resources: {limits: {cpu: two}}\n',
      'spec.containers[0].resources.limits.cpu "two" is not a quantity',
    ],
    [
      'a limit below its request',
      'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}\n',
      'spec.containers[0].resources.limits.memory is 1Gi, below its request of 2Gi [SIZING_LIMIT_BELOW_REQUEST]',
    ],
    [
      'a mount of an undeclared volume',
      'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    volumeMounts: [{name: data, mountPath: /data}]\n',
      'spec.containers[0].volumeMounts[0].name "data" is not a volume of spec.volumes',
    ],
    ['a proto3 JSON request with a typo', '{"config": {"podResource": {}}}', 'PROTOJSON_INVALID'],
    [
      'a proto3 JSON request with a bad enum',
      '{"config": {"podResources": {"containers": [{"name": "a", "type": "EPHEMERAL"}]}}}',
      'PROTOJSON_INVALID',
    ],
    ['a request without config', '{"runtimeHandler": "kata-ts"}', 'without a config'],
    ['a YAML request without kind', 'config: {}\n', 'must be a RunPodSandboxRequest in proto3 JSON, not YAML'],
    ['a bare list', '[1, 2]\n', 'neither a Pod manifest nor a RunPodSandboxRequest'],
  ])('exits 2 with one line for %s', async (name, text, message) => {
    const target = text === '' ? path.join(dir, 'does-not-exist.yaml') : file(`${name.replace(/\W+/g, '-')}.yaml`, text);
    const r = await plan('--request', target, '--config', emptyConfig, ...BIG);
    expect(r.code).toBe(2);
    expectOneLine(r.stderr);
    expect(r.stderr).toContain(message);
    expect(r.stderr).toContain(target);
    expect(r.stdout).toBe('');
  });
});
