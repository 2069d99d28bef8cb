/**
 * Seccomp, AppArmor and SELinux requests. Pure.
 *
 * AppArmor and SELinux profiles live in the host kernel's policy; the container runs under the
 * guest kernel, which loads neither the host's policy nor any of its own. A request for a specific
 * profile is therefore refused (INVALID_ARGUMENT naming the field) rather than dropped; "runtime
 * default" and "unconfined" are accepted and mean nothing more than the VM boundary.
 */
import type { OciContainerSecurityInput, OciSecurityProfileInput } from './input.js';
import { fieldError } from './process.js';
import { runtimeDefaultProfile } from './seccomp-default.js';
import { parseLocalhostProfile } from './seccomp-localhost.js';
import type { OciSeccomp } from './spec-types.js';

const SC = 'container.linux.security_context';

type Choice = { kind: 'RuntimeDefault' } | { kind: 'Unconfined' } | { kind: 'Localhost'; ref: string };

/** The structured field wins; the deprecated path strings (`runtime/default`, `localhost/<path>`) are the fallback. */
function choose(profile: OciSecurityProfileInput | null | undefined, legacy: string, field: string, legacyField: string): Choice {
  if (profile != null) {
    switch (profile.profile_type ?? 'RuntimeDefault') {
      case 'RuntimeDefault':
        return { kind: 'RuntimeDefault' };
      case 'Unconfined':
        return { kind: 'Unconfined' };
      case 'Localhost': {
        const ref = profile.localhost_ref ?? '';
        if (ref === '') throw fieldError('OCI_PROFILE_REF_MISSING', `${field}.localhost_ref`, 'is empty for a Localhost profile');
        return { kind: 'Localhost', ref };
      }
    }
  }
  if (legacy === '' || legacy === 'unconfined') return { kind: 'Unconfined' };
  if (legacy === 'runtime/default' || legacy === 'docker/default') return { kind: 'RuntimeDefault' };
  if (legacy.startsWith('localhost/')) return { kind: 'Localhost', ref: legacy.slice('localhost/'.length) };
  throw fieldError('OCI_PROFILE_UNKNOWN', legacyField, `is "${legacy}", not runtime/default, unconfined or localhost/<path>`);
}

/**
 * The seccomp filter, or undefined for none. No profile at all is Unconfined (Kubernetes'
 * default without the SeccompDefault kubelet option). Privileged containers run unconfined
 * whatever they ask, as Kubernetes documents. A Localhost profile's text must be passed in.
 */
export function resolveSeccomp(
  security: OciContainerSecurityInput | null | undefined,
  capabilities: readonly string[],
  localhostProfile: string | undefined,
): OciSeccomp | undefined {
  const choice = choose(security?.seccomp, security?.seccomp_profile_path ?? '', `${SC}.seccomp`, `${SC}.seccomp_profile_path`);
  if (security?.privileged === true || choice.kind === 'Unconfined') return undefined;
  if (choice.kind === 'RuntimeDefault') return runtimeDefaultProfile(capabilities);
  const field = security?.seccomp != null ? `${SC}.seccomp.localhost_ref` : `${SC}.seccomp_profile_path`;
  if (localhostProfile === undefined) {
    throw fieldError('OCI_SECCOMP_PROFILE_MISSING', field, `names "${choice.ref}", whose content was not provided`);
  }
  return parseLocalhostProfile(localhostProfile, field, capabilities);
}

/** The Localhost seccomp profile a container names (a path on the node), for the caller to read. */
export function seccompLocalhostRef(security: OciContainerSecurityInput | null | undefined): string | undefined {
  const choice = choose(security?.seccomp, security?.seccomp_profile_path ?? '', `${SC}.seccomp`, `${SC}.seccomp_profile_path`);
  return choice.kind === 'Localhost' ? choice.ref : undefined;
}

/** Refuse a specific AppArmor profile or any SELinux label; accept runtime default and unconfined. */
export function checkMacRequests(security: OciContainerSecurityInput | null | undefined): void {
  const apparmor = choose(security?.apparmor, security?.apparmor_profile ?? '', `${SC}.apparmor`, `${SC}.apparmor_profile`);
  if (apparmor.kind === 'Localhost') {
    const field = security?.apparmor != null ? `${SC}.apparmor` : `${SC}.apparmor_profile`;
    throw fieldError(
      'OCI_APPARMOR_UNSUPPORTED',
      field,
      `asks for AppArmor profile "${apparmor.ref}", which the pod VM's kernel cannot apply`,
    );
  }
  const se = security?.selinux_options;
  if (se != null && [se.user, se.role, se.type, se.level].some((v) => v !== undefined && v !== '')) {
    throw fieldError(
      'OCI_SELINUX_UNSUPPORTED',
      `${SC}.selinux_options`,
      "asks for an SELinux label, which the pod VM's kernel cannot apply",
    );
  }
}
