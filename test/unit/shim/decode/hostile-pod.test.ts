/**
 * The shim's pod decoder against hostile annotations (src/shim/decode/pod.ts through the core's
 * name grammar), and the resolv.conf read (src/shim/bundle.ts): a pod identity that would split
 * CNI_ARGS, or a CRI-O ResolvPath naming a host file outside the bundle, is refused naming the
 * annotation; the file read never follows a link, blocks on a FIFO or takes more than its bound.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { MAX_RESOLV_CONF_BYTES, readResolvConf } from '../../../../src/shim/bundle.js';
import { decodePodSpec } from '../../../../src/shim/decode/index.js';
import { thrown } from '../../../helpers/kata-error.js';
import { edited } from './fixtures.js';

const SANDBOX = 'containerd/1.6.20/sandbox.config.synthetic.json';
const CRIO_SANDBOX = 'cri-o/1.28/sandbox.config.synthetic.json';
const RESOLV = 'io.kubernetes.cri-o.ResolvPath';
const BUNDLE = '/run/containers/storage/overlay-containers/abc/userdata';

describe('pod identity annotations that would split CNI_ARGS', () => {
  it.each([
    ['io.kubernetes.cri.sandbox-name', 'x;K8S_POD_NAMESPACE=kube-system'],
    ['io.kubernetes.cri.sandbox-uid', 'u;K8S_POD_NAME=other'],
    ['io.kubernetes.cri.sandbox-namespace', 'a=b'],
    ['io.kubernetes.cri.sandbox-name', '../../etc'],
  ])('containerd %s = %j', (key, value) => {
    const err = thrown(() => decodePodSpec(edited(SANDBOX, (o) => (o.annotations[key] = value))));
    expect([err.kind, err.reason]).toEqual(['invalid', 'SANDBOX_METADATA_INVALID']);
    expect(err.message.startsWith(`annotations["${key}"]`), err.message).toBe(true);
  });

  it('CRI-O Metadata and KubeName', () => {
    const meta = thrown(() =>
      decodePodSpec(
        edited(CRIO_SANDBOX, (o) => (o.annotations['io.kubernetes.cri-o.Metadata'] = '{"name":"a;b=c","uid":"u","namespace":"n"}')),
      ),
    );
    expect(meta.message.startsWith('annotations["io.kubernetes.cri-o.Metadata"].name'), meta.message).toBe(true);
    const kube = thrown(() =>
      decodePodSpec(
        edited(CRIO_SANDBOX, (o) => {
          o.annotations['io.kubernetes.cri-o.Metadata'] = '{"uid":"u","namespace":"n"}';
          o.annotations['io.kubernetes.cri-o.KubeName'] = 'x y';
        }),
      ),
    );
    expect(kube.message.startsWith('annotations["io.kubernetes.cri-o.KubeName"]'), kube.message).toBe(true);
  });
});

describe("CRI-O's ResolvPath is held to the bundle", () => {
  it('<bundle>/resolv.conf is taken (/var/run and /run alike); none or "" is no resolv.conf', () => {
    expect(
      decodePodSpec(
        edited(CRIO_SANDBOX, (o) => (o.annotations[RESOLV] = `/var${BUNDLE}/resolv.conf`)),
        { bundle: BUNDLE },
      ).resolvConfPath,
    ).toBe(`/var${BUNDLE}/resolv.conf`);
    expect(
      decodePodSpec(
        edited(CRIO_SANDBOX, (o) => (o.annotations[RESOLV] = `${BUNDLE}/resolv.conf`)),
        { bundle: BUNDLE },
      ).resolvConfPath,
    ).toBe(`${BUNDLE}/resolv.conf`);
    const none = decodePodSpec(
      edited(CRIO_SANDBOX, (o) => {
        o.annotations[RESOLV] = '';
        o.mounts = [];
      }),
      { bundle: BUNDLE },
    );
    expect(none.resolvConfPath).toBeNull();
  });

  it.each(['/etc/shadow', `${BUNDLE}/../../../../etc/shadow`, `${BUNDLE}/config.json`, 'resolv.conf'])('refuses %j', (value) => {
    const err = thrown(() =>
      decodePodSpec(
        edited(CRIO_SANDBOX, (o) => (o.annotations[RESOLV] = value)),
        { bundle: BUNDLE },
      ),
    );
    expect([err.kind, err.reason]).toEqual(['invalid', 'SHIM_ANNOTATION_INVALID']);
    expect(err.message.startsWith(`annotations["${RESOLV}"] must name resolv.conf in the sandbox's bundle`), err.message).toBe(true);
  });
});

describe('readResolvConf', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'kata-ts-resolv-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('reads a regular file; a link, a FIFO, a directory or an oversized file gives nothing', async () => {
    writeFileSync(path.join(dir, 'resolv.conf'), 'nameserver 10.96.0.10\n');
    expect(await readResolvConf(path.join(dir, 'resolv.conf'))).toBe('nameserver 10.96.0.10\n');
    writeFileSync(path.join(dir, 'secret'), 'root-only');
    symlinkSync(path.join(dir, 'secret'), path.join(dir, 'link'));
    execFileSync('mkfifo', [path.join(dir, 'fifo')]);
    writeFileSync(path.join(dir, 'big'), 'x'.repeat(MAX_RESOLV_CONF_BYTES + 1));
    for (const f of ['link', 'fifo', 'big', '.', 'missing']) expect(await readResolvConf(path.join(dir, f)), f).toBeUndefined();
  });
});
