/**
 * Reason codes of the runtime's side of VM templates (src/runtime/template/): a clone that could
 * not be made fit to serve a pod. Declaration merging makes them known to src/common/errors.ts.
 */
export type RuntimeTemplateReason = 'TEMPLATE_RESEED_FAILED' | 'TEMPLATE_ROOT_UNSAFE';

declare module '../../common/errors.js' {
  interface KataReasons {
    runtimeTemplate: RuntimeTemplateReason;
  }
}
