/** Reason codes (`KataError.reason`) of the shim's Sandbox API (src/shim/sandbox-service.ts). */
export type ShimSandboxReason =
  /** CreateSandbox's `options` is not a runtime.v1.PodSandboxConfig (or `rootfs` is set). */
  | 'SHIM_SANDBOX_OPTIONS_INVALID'
  /** A sandbox id that is not this shim's, or a sandbox that is not running. */
  | 'SHIM_SANDBOX_UNKNOWN'
  /** CreateSandbox twice. */
  | 'SHIM_SANDBOX_EXISTS'
  /** StartSandbox before CreateSandbox. */
  | 'SHIM_SANDBOX_NOT_CREATED';

declare module '../common/errors.js' {
  interface KataReasons {
    shimSandbox: ShimSandboxReason;
  }
}
