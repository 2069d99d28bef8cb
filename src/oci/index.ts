/** The OCI runtime spec generator (pure): see build.ts. */
export { buildOciSpec, DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS, type OciSpecPlan } from './build.js';
export { ALL_CAPABILITIES, DEFAULT_CAPABILITIES } from './capabilities.js';
export type { OciContainerFile } from './etc-files.js';
export { type GuestPod, guestLayout } from './guest-layout.js';
export type * from './input.js';
export { runtimeDefaultProfile } from './seccomp-default.js';
export { seccompLocalhostRef } from './security.js';
export type * from './spec-types.js';
export { OCI_VERSION } from './spec-types.js';
