/**
 * The real swtpm launcher (src/tpm/swtpm.ts), adapted to the sandbox floor's launcher set, so
 * that tests replace it like every other process the sandbox starts.
 */
import type { JailSpec } from '../../hypervisor/index.js';
import { attachSwtpm, startSwtpm, swtpmJailSpec } from '../../tpm/swtpm.js';
import type { StartSwtpmRequest, SwtpmHandle } from './create-types.js';

/** startSwtpm of src/tpm/swtpm.ts. */
export function startSwtpmProcess(request: StartSwtpmRequest): Promise<SwtpmHandle> {
  return startSwtpm(request);
}

/** swtpmJailSpec of src/tpm/swtpm.ts. */
export async function swtpmJailSpecOf(o: Parameters<typeof swtpmJailSpec>[0]): Promise<Omit<JailSpec, 'rootLinks'>> {
  return swtpmJailSpec(o);
}

/** attachSwtpm of src/tpm/swtpm.ts: the handle of a swtpm started earlier, from its record. */
export async function attachSwtpmProcess(record: Parameters<typeof attachSwtpm>[0]): Promise<SwtpmHandle> {
  return attachSwtpm(record);
}
