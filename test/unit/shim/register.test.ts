import { describe, expect, it } from 'vitest';
import { handlerForBinary } from '../../../src/shim/register.js';

describe('the handler a shim binary runs pods with', () => {
  const known = ['kata-ts', 'kata-ts-cvm'];

  it('is named by the binary containerd derives from the runtime type', () => {
    expect(handlerForBinary('/usr/local/bin/containerd-shim-kata-ts-v2', known)).toBe('kata-ts');
    expect(handlerForBinary('/usr/local/bin/containerd-shim-kata-ts-cvm-v2', known)).toBe('kata-ts-cvm');
  });

  it('is kata-ts for a name the config does not know, or any other binary name', () => {
    expect(handlerForBinary('/usr/local/bin/containerd-shim-other-v2', known)).toBe('kata-ts');
    expect(handlerForBinary('/repo/bin/kata-ts.js', known)).toBe('kata-ts');
    expect(handlerForBinary('', known)).toBe('kata-ts');
  });
});
