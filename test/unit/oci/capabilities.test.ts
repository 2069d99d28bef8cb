import { describe, expect, it } from 'vitest';
import { ALL_CAPABILITIES, DEFAULT_CAPABILITIES, resolveCapabilities } from '../../../src/oci/capabilities.js';
import { thrown } from './load.js';

const caps = (add: string[], drop: string[], ambient: string[] = [], privileged = false) =>
  resolveCapabilities({ privileged, capabilities: { add_capabilities: add, drop_capabilities: drop, add_ambient_capabilities: ambient } });

describe('capabilities', () => {
  it('the default set without a request, the same in bounding, effective and permitted; inheritable empty', () => {
    const c = resolveCapabilities(null);
    expect(c.bounding).toEqual([...DEFAULT_CAPABILITIES]);
    expect(c.effective).toEqual(c.bounding);
    expect(c.permitted).toEqual(c.bounding);
    expect(c.inheritable).toEqual([]);
    expect(c.ambient).toEqual([]);
    expect(DEFAULT_CAPABILITIES).toHaveLength(14);
  });
  it('add and drop accept names with or without CAP_, any case', () => {
    const c = caps(['net_admin', 'CAP_SYS_TIME'], ['NET_RAW', 'cap_mknod']);
    expect(c.bounding).toContain('CAP_NET_ADMIN');
    expect(c.bounding).toContain('CAP_SYS_TIME');
    expect(c.bounding).not.toContain('CAP_NET_RAW');
    expect(c.bounding).not.toContain('CAP_MKNOD');
  });
  it('drop ALL then add: only the added ones', () => {
    expect(caps(['NET_BIND_SERVICE'], ['ALL']).bounding).toEqual(['CAP_NET_BIND_SERVICE']);
  });
  it('add ALL minus drops', () => {
    const c = caps(['ALL'], ['SYS_ADMIN']);
    expect(c.bounding).toHaveLength(ALL_CAPABILITIES.length - 1);
    expect(c.bounding).not.toContain('CAP_SYS_ADMIN');
  });
  it('a capability both added and dropped ends up dropped', () => {
    expect(caps(['NET_ADMIN'], ['NET_ADMIN']).bounding).not.toContain('CAP_NET_ADMIN');
  });
  it('privileged gets every capability whatever the lists say', () => {
    expect(caps([], ['ALL'], [], true).bounding).toEqual([...ALL_CAPABILITIES]);
  });
  it('ambient capabilities are also inheritable, and must be granted', () => {
    const c = caps(['NET_ADMIN'], [], ['NET_ADMIN']);
    expect(c.ambient).toEqual(['CAP_NET_ADMIN']);
    expect(c.inheritable).toEqual(['CAP_NET_ADMIN']);
    expect(thrown(() => caps([], [], ['SYS_ADMIN'])).reason).toBe('OCI_AMBIENT_NOT_GRANTED');
    expect(thrown(() => caps([], [], ['ALL'])).reason).toBe('OCI_CAPABILITY_UNKNOWN');
  });
  it('an unknown name is refused naming its place', () => {
    const err = thrown(() => caps(['NET_ADMIN', 'FLY'], []));
    expect(err.reason).toBe('OCI_CAPABILITY_UNKNOWN');
    expect(err.message).toMatch(/^container\.linux\.security_context\.capabilities\.add_capabilities\[1\]/);
  });
});
