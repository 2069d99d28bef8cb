/**
 * The real swtpm launcher: src/tpm/swtpm.ts's startSwtpm (helper "swtpm" of issue 31, written in
 * parallel). Loaded when first needed, so that this floor builds and every non-vtpm pod runs
 * while that module is not in the tree; a vtpm pod is then refused with a coded error, never
 * booted without its TPM.
 */
import { errorMessage, precondition } from '../../common/errors.js';
import type { StartSwtpmRequest, SwtpmHandle } from './create-types.js';

type StartSwtpm = (request: StartSwtpmRequest) => Promise<SwtpmHandle>;

// A computed specifier: the module may not exist yet (see the file's comment).
const SWTPM_MODULE = ['..', '..', 'tpm', 'swtpm.js'].join('/');

/** startSwtpm of src/tpm/swtpm.ts, or SWTPM_UNAVAILABLE when that module is missing. */
export async function startSwtpmProcess(request: StartSwtpmRequest): Promise<SwtpmHandle> {
  let start: StartSwtpm | undefined;
  try {
    const mod = (await import(SWTPM_MODULE)) as { startSwtpm?: StartSwtpm };
    start = mod.startSwtpm;
  } catch (err) {
    throw precondition('SWTPM_UNAVAILABLE', `the swtpm launcher (src/tpm/swtpm.ts) cannot be loaded: ${errorMessage(err)}`);
  }
  if (start === undefined) throw precondition('SWTPM_UNAVAILABLE', 'src/tpm/swtpm.ts exports no startSwtpm.');
  return start(request);
}
