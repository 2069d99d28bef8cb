import { describe, expect, it } from 'vitest';
import type { OciSpecInput } from '../../../../src/oci/input.js';
import { sandboxSpecFor } from '../../../../src/runtime/container/create.js';
import type { ContainerSpec } from '../../../../src/runtime/spec/container.js';

const pod = {
  metadata: { name: 'p', uid: 'u', namespace: 'n', attempt: 0 },
  linux: { sysctls: { 'net.ipv4.ip_forward': '1' } },
} as unknown as OciSpecInput['sandbox'];
const container = (privileged: boolean) => ({ linux: { security_context: { privileged } } }) as unknown as ContainerSpec;

describe('sandboxSpecFor: the pod spec a container is built against', () => {
  it("finds the pod privileged only for a privileged container its caller's manager admitted", () => {
    expect(sandboxSpecFor(pod, container(true), true).linux?.security_context?.privileged).toBe(true);
    // The recorded spec is not changed: the next container is judged on its own.
    expect(pod.linux?.security_context).toBeUndefined();
    expect(sandboxSpecFor(pod, container(true), true).linux?.sysctls).toEqual({ 'net.ipv4.ip_forward': '1' });
    // The standalone door (no caller vouching) and unprivileged containers get the pod as recorded.
    expect(sandboxSpecFor(pod, container(true), false)).toBe(pod);
    expect(sandboxSpecFor(pod, container(false), true)).toBe(pod);
  });
});
