/**
 * The template store's pure parts (src/runtime/template/store.ts): a template directory's name
 * from its key (the shape part from the argv alone, the rest from every input), and which
 * entries are stale once a template is ready. Building, reuse and rebuild on real QEMU:
 * test/integration/template-store.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { TemplateKey } from '../../../../src/hypervisor/template.js';
import { staleTemplateDirs, templateDirName } from '../../../../src/runtime/template/store.js';

const key: TemplateKey = {
  qemuBinarySha256: 'a'.repeat(64),
  kernelSha256: 'b'.repeat(64),
  initrdSha256: 'c'.repeat(64),
  guestImageSha256: 'd'.repeat(64),
  argvSha256: `0123456789abcdef${'e'.repeat(48)}`,
};

describe('templateDirName', () => {
  it('names the shape by the argv digest and the template by every input', () => {
    const { shape, name } = templateDirName(key);
    expect(shape).toBe('0123456789abcdef');
    expect(name).toMatch(/^0123456789abcdef-[0-9a-f]{16}$/);
    // Another kernel: same shape, another template.
    const other = templateDirName({ ...key, kernelSha256: 'f'.repeat(64) });
    expect(other.shape).toBe(shape);
    expect(other.name).not.toBe(name);
    // An initramfs-only guest differs from one with an image.
    expect(templateDirName({ ...key, guestImageSha256: null }).name).not.toBe(name);
    expect(templateDirName({ ...key }).name).toBe(name);
  });
});

describe('staleTemplateDirs', () => {
  it('is the same shape under another key, never the wanted one, another shape or a foreign entry', () => {
    const wanted = templateDirName(key);
    const older = templateDirName({ ...key, initrdSha256: '1'.repeat(64) }).name;
    const otherShape = templateDirName({ ...key, argvSha256: 'f'.repeat(64) }).name;
    expect(staleTemplateDirs([wanted.name, older, otherShape, 'lost+found', `${older}.tmp`], wanted)).toEqual([older]);
    expect(staleTemplateDirs([], wanted)).toEqual([]);
  });
});
