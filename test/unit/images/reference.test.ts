import { describe, expect, it } from 'vitest';
import type { Digest } from '../../../src/images/digest.js';
import {
  formatReference,
  isBareRepository,
  parseReference,
  registryApiHost,
  repoDigestOf,
  repoTagOf,
} from '../../../src/images/reference.js';

const D = `sha256:${'a'.repeat(64)}` as Digest;

describe('parseReference (Docker normalisation, as containerd and CRI-O report names)', () => {
  it.each([
    ['busybox', 'docker.io', 'library/busybox', 'latest', undefined, 'docker.io/library/busybox:latest'],
    ['busybox:1.36', 'docker.io', 'library/busybox', '1.36', undefined, 'docker.io/library/busybox:1.36'],
    ['library/busybox', 'docker.io', 'library/busybox', 'latest', undefined, 'docker.io/library/busybox:latest'],
    ['index.docker.io/busybox', 'docker.io', 'library/busybox', 'latest', undefined, 'docker.io/library/busybox:latest'],
    ['bitnami/redis:7', 'docker.io', 'bitnami/redis', '7', undefined, 'docker.io/bitnami/redis:7'],
    ['quay.io/coreos/etcd:v3.5', 'quay.io', 'coreos/etcd', 'v3.5', undefined, 'quay.io/coreos/etcd:v3.5'],
    ['localhost:5000/app', 'localhost:5000', 'app', 'latest', undefined, 'localhost:5000/app:latest'],
    ['localhost/app:dev', 'localhost', 'app', 'dev', undefined, 'localhost/app:dev'],
    ['127.0.0.1:5000/a/b/c:x_y.z-1', '127.0.0.1:5000', 'a/b/c', 'x_y.z-1', undefined, '127.0.0.1:5000/a/b/c:x_y.z-1'],
    ['[::1]:5000/app:1', '[::1]:5000', 'app', '1', undefined, '[::1]:5000/app:1'],
    [`busybox@${D}`, 'docker.io', 'library/busybox', undefined, D, `docker.io/library/busybox@${D}`],
    // name:tag@digest pulls by digest; the tag is dropped (containerd's ParseDockerRef).
    [`registry.k8s.io/pause:3.9@${D}`, 'registry.k8s.io', 'pause', undefined, D, `registry.k8s.io/pause@${D}`],
    ['my.registry/a__b/c--d/e.f:t', 'my.registry', 'a__b/c--d/e.f', 't', undefined, 'my.registry/a__b/c--d/e.f:t'],
  ])('%s', (input, domain, path, tag, digest, formatted) => {
    const ref = parseReference(input);
    expect(ref).toEqual({ domain, path, tag, digest });
    expect(formatReference(ref)).toBe(formatted);
  });

  it.each([
    ['', 'empty'],
    ['Busybox', 'path component'],
    ['busybox:', 'tag'],
    ['busybox:-bad', 'tag'],
    ['a'.repeat(64), 'image id'],
    ['busybox@sha256:short', 'digest'],
    [`busybox@md5:${'a'.repeat(32)}`, 'digest'],
    ['host:port:bad/x', 'registry'],
    ['a//b', 'path component'],
    ['a/b_/c', 'path component'],
    [' busybox', 'whitespace'],
    [`x/${'a'.repeat(260)}`, 'longer than'],
  ])('refuses %j with INVALID IMAGE_REFERENCE_INVALID naming the field', (input, fragment) => {
    try {
      parseReference(input, 'image.image');
      expect.unreachable();
    } catch (err) {
      expect(err).toMatchObject({ kind: 'invalid', reason: 'IMAGE_REFERENCE_INVALID' });
      expect((err as Error).message).toContain('image.image');
      expect((err as Error).message).toContain(fragment);
    }
  });

  it('builds repo tags and repo digests, and maps docker.io to its API host', () => {
    const ref = parseReference('alpine:3');
    expect(repoTagOf(ref)).toBe('docker.io/library/alpine:3');
    expect(repoDigestOf(ref, D)).toBe(`docker.io/library/alpine@${D}`);
    expect(repoTagOf(parseReference(`alpine@${D}`))).toBeUndefined();
    expect(registryApiHost('docker.io')).toBe('registry-1.docker.io');
    expect(registryApiHost('localhost:5000')).toBe('localhost:5000');
  });

  it('tells bare repositories from tagged or digested references', () => {
    expect(isBareRepository('busybox')).toBe(true);
    expect(isBareRepository('localhost:5000/app')).toBe(true);
    expect(isBareRepository('busybox:1')).toBe(false);
    expect(isBareRepository(`busybox@${D}`)).toBe(false);
  });
});
