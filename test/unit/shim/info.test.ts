import { Buffer } from 'node:buffer';
import { execFile } from 'node:child_process';
import { Readable, Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { isKataError } from '../../../src/common/errors.js';
import { packageVersion } from '../../../src/common/paths.js';
import { decodeInfoOptions, OCI_FEATURES_TYPE_URL, ociFeatures, RUNTIME_NAME, shimInfo } from '../../../src/shim/info.js';
import { main } from '../../../src/shim/main.js';
import { decodeMessage } from '../../../src/shim/proto.js';
import { cat, lfield } from './wire.js';

/** runc's options as containerd 2.1 would send them for `BinaryName = "/usr/bin/crun"` (options.proto field 3). */
const RUNC_OPTIONS_ANY = cat(lfield(1, 'containerd.runc.v1.Options'), lfield(2, lfield(3, '/usr/bin/crun')));

function sink(): { stream: Writable; bytes: () => Buffer } {
  const chunks: Buffer[] = [];
  const stream = new Writable({
    write(chunk: Buffer | string, _enc, done) {
      chunks.push(Buffer.from(chunk));
      done();
    },
  });
  return { stream, bytes: () => Buffer.concat(chunks) };
}

async function runInfo(stdin: Buffer): Promise<{ code: number; stdout: Buffer; stderr: string }> {
  const out = sink();
  const err = sink();
  const code = await main(['-info'], { io: { stdout: out.stream, stderr: err.stream, stdin: Readable.from([stdin]) }, env: {} });
  return { code, stdout: out.bytes(), stderr: err.bytes().toString() };
}

describe('-info (containerd.types.RuntimeInfo)', () => {
  it('is, byte for byte, the message with upstream field numbers: name 1, version 2 {version 1, revision 2}, options 3, features 4', () => {
    const features = Buffer.from(JSON.stringify(ociFeatures()), 'utf8');
    const expected = cat(
      lfield(1, 'io.containerd.kata-ts.v2'),
      lfield(2, lfield(1, '1.2.3')),
      lfield(3, RUNC_OPTIONS_ANY),
      lfield(4, cat(lfield(1, 'types.containerd.io/opencontainers/runtime-spec/1/features/Features'), lfield(2, features))),
    );
    expect(shimInfo(RUNC_OPTIONS_ANY, '1.2.3').equals(expected)).toBe(true);
  });

  it('without options on stdin (none configured) the answer carries none', () => {
    const info = decodeMessage('containerd.types.RuntimeInfo', shimInfo(Buffer.alloc(0), '1.2.3'));
    expect(info.name).toBe(RUNTIME_NAME);
    expect(info.options).toBeNull();
    expect(info.features?.type_url).toBe(OCI_FEATURES_TYPE_URL);
  });

  it('states rro among the mount options, a linux section (containerd dereferences it), and neither user namespaces nor id-mapped mounts', () => {
    const info = decodeMessage('containerd.types.RuntimeInfo', shimInfo(RUNC_OPTIONS_ANY));
    const features = JSON.parse(Buffer.from(info.features!.value).toString('utf8'));
    expect(features.mountOptions).toContain('rro');
    expect(features.mountOptions).toEqual(expect.arrayContaining(['ro', 'rw', 'rbind', 'rprivate']));
    // Options the guest's bind does not apply are not claimed.
    expect(features.mountOptions).not.toContain('nosuid');
    expect(features.linux).toEqual({ mountExtensions: { idmap: { enabled: false } } });
    expect(features.linux.namespaces ?? []).not.toContain('user');
    expect(features.ociVersionMin).toBe('1.0.0');
    expect(info.version).toEqual({ version: packageVersion(), revision: '' });
  });

  it('stdin that is not an Any is refused with SHIM_INFO_OPTIONS_INVALID', () => {
    for (const bad of [Buffer.from([0xff, 0xff, 0xff]), lfield(2, 'value without a type url')]) {
      let err: unknown;
      try {
        decodeInfoOptions(bad);
      } catch (e) {
        err = e;
      }
      expect(isKataError(err) && err.reason).toBe('SHIM_INFO_OPTIONS_INVALID');
    }
  });

  it('main: -info prints the message on stdout and exits 0; bad stdin exits 1 with one sentence and prints nothing', async () => {
    const ok = await runInfo(RUNC_OPTIONS_ANY);
    expect(ok.code).toBe(0);
    expect(ok.stderr).toBe('');
    expect(ok.stdout.equals(shimInfo(RUNC_OPTIONS_ANY))).toBe(true);
    const bad = await runInfo(Buffer.from([0xff, 0xff, 0xff]));
    expect(bad.code).toBe(1);
    expect(bad.stdout.length).toBe(0);
    expect(bad.stderr).toMatch(/^containerd-shim-kata-ts-v2 -info: the runtime options on stdin are not a google\.protobuf\.Any\.\n$/);
  });

  it("protoc decodes -info's answer with containerd's message layout (an independent decoder)", async () => {
    const stdout = (await runInfo(RUNC_OPTIONS_ANY)).stdout;
    const text = await new Promise<string>((resolve, reject) => {
      const child = execFile('protoc', ['--decode_raw'], (err, out) => (err ? reject(err) : resolve(out)));
      child.stdin?.end(stdout);
    });
    expect(text).toContain('1: "io.containerd.kata-ts.v2"');
    expect(text).toContain('1: "types.containerd.io/opencontainers/runtime-spec/1/features/Features"');
    expect(text).toContain('1: "containerd.runc.v1.Options"');
  });
});
