/**
 * deploy/: the installer DaemonSet's manifest is valid YAML of the expected objects and wires the
 * entry script the way docs/install.md says (privileged, host PID, the host at /host, the node's
 * name, cleanup on preStop, RBAC to patch nodes); the script calls the commands of this repo with
 * the paths the defaults use; the node label is the one the RuntimeClasses select.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { RUNTIME_NODE_LABEL } from '../../../src/cli/plan/overhead.js';
import { packageRoot } from '../../../src/common/paths.js';
import { DEFAULT_GUEST_DIR } from '../../../src/config/defaults.js';
import { DEFAULT_CONTAINERD_CONFIG } from '../../../src/install/index.js';

const deploy = (f: string) => readFileSync(path.join(packageRoot(), 'deploy', f), 'utf8');

// biome-ignore lint/suspicious/noExplicitAny: parsed YAML, read by key path in assertions only
type Doc = any;

describe('deploy/kata-ts-deploy.yaml', () => {
  const docs = parseAllDocuments(deploy('kata-ts-deploy.yaml'));
  it('parses without errors into ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet', () => {
    expect(docs.flatMap((d) => d.errors)).toEqual([]);
    expect(docs.map((d) => (d.toJS() as Doc).kind)).toEqual(['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'DaemonSet']);
  });

  it('the DaemonSet runs the entry script privileged, in the host PID namespace, with the host at /host', () => {
    const ds = docs[3]!.toJS() as Doc;
    const pod = ds.spec.template.spec;
    expect(ds.spec.selector.matchLabels).toEqual(ds.spec.template.metadata.labels);
    expect(pod.hostPID).toBe(true);
    expect(pod.serviceAccountName).toBe((docs[0]!.toJS() as Doc).metadata.name);
    const c = pod.containers[0];
    expect(c.securityContext.privileged).toBe(true);
    expect(c.args).toEqual(['install']);
    expect(c.env).toContainEqual({ name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } });
    expect(c.lifecycle.preStop.exec.command).toEqual(['/usr/local/bin/kata-ts-deploy.sh', 'cleanup']);
    const mount = c.volumeMounts.find((m: Doc) => m.mountPath === '/host');
    expect(pod.volumes.find((v: Doc) => v.name === mount.name).hostPath.path).toBe('/');
  });

  it('RBAC: the service account may get and patch nodes, nothing more', () => {
    const role = docs[1]!.toJS() as Doc;
    expect(role.rules).toEqual([{ apiGroups: [''], resources: ['nodes'], verbs: ['get', 'patch'] }]);
    const binding = docs[2]!.toJS() as Doc;
    expect(binding.roleRef.name).toBe(role.metadata.name);
    expect(binding.subjects[0]).toMatchObject({ name: 'kata-ts-deploy', namespace: 'kube-system' });
  });
});

describe('deploy/kata-ts-deploy.sh and deploy/Dockerfile', () => {
  const script = deploy('kata-ts-deploy.sh');
  it('copies the release, installs the handlers below /host, restarts containerd through PID 1, labels the node', () => {
    expect(script).toContain('kata-ts release install --prefix "$HOST$PREFIX" --bin-dir "$HOST$BIN_DIR"');
    expect(script).toMatch(/^PREFIX=\/opt\/kata-ts$/m);
    expect(script).toMatch(/^BIN_DIR=\/usr\/local\/bin$/m);
    expect(script).toContain(`GUEST_DIR=${DEFAULT_GUEST_DIR}`);
    expect(script).toContain('kata-ts install --containerd --host-root "$HOST"');
    expect(script).toContain('kata-ts uninstall --containerd --host-root "$HOST"');
    expect(script).toContain('nsenter --target 1 --mount --uts --ipc --net --pid --');
    expect(script).toContain('on_host systemctl restart containerd');
    expect(script).toContain(`LABEL=${RUNTIME_NODE_LABEL}`);
    // The handlers go where the host's containerd reads them: its default config, below /host.
    expect(DEFAULT_CONTAINERD_CONFIG).toBe('/etc/containerd/config.toml');
  });

  it('the image runs the script, with kata-ts on its PATH and the guest where the script copies it from', () => {
    const dockerfile = deploy('Dockerfile');
    expect(dockerfile).toContain('COPY deploy/kata-ts-deploy.sh /usr/local/bin/kata-ts-deploy.sh');
    expect(dockerfile).toContain('ENTRYPOINT ["/usr/local/bin/kata-ts-deploy.sh"]');
    expect(dockerfile).toContain('RUN ln -s /opt/kata-ts/bin/kata-ts.js /usr/local/bin/kata-ts');
    expect(dockerfile).toContain('scripts/build-guest.sh --out /opt/kata-ts-guest');
    expect(script).toMatch(/^IMAGE_GUEST=\$\{IMAGE_GUEST:-\/opt\/kata-ts-guest\}$/m);
  });
});
