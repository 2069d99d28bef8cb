/**
 * /etc/hostname, /etc/hosts and /etc/resolv.conf of a pod: their text, and where they are
 * bind-mounted from. Pure; the caller writes the text into `guest.etcDir` once per pod.
 *
 * DNS: with a `dns_config` (the kubelet always sends one) resolv.conf holds exactly its servers,
 * searches and options. Without one the image's own /etc/resolv.conf is left as it is: the host's
 * file is never copied, because a host resolver at a loopback address (systemd-resolved's
 * 127.0.0.53) is unreachable from inside the VM.
 */
import type { OciGuestLayout, OciSandboxInput } from './input.js';
import { fieldError } from './process.js';
import type { OciMount } from './spec-types.js';

/** A file the caller must place at `guestPath` before the container starts. */
export interface OciContainerFile {
  /** Where it appears in the container. */
  containerPath: string;
  /** Where it lives in the guest (under `guest.etcDir`), the bind mount's source. */
  guestPath: string;
  content: string;
  /** Permission bits for the file. */
  mode: number;
}

/** RFC 1123: dot-separated labels of letters, digits and inner hyphens, each label 63 bytes at most, 64 in all (Linux HOST_NAME_MAX: a kubelet's FQDN hostname may use all 64; the same bound RunPodSandbox checks). */
const HOSTNAME = /^(?=.{1,64}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/i;

/** The pod's hostname, or undefined when the sandbox gives none (the guest's own stays). */
export function resolveHostname(sandbox: OciSandboxInput): string | undefined {
  const name = sandbox.hostname ?? '';
  if (name === '') return undefined;
  if (!HOSTNAME.test(name))
    throw fieldError('OCI_HOSTNAME_INVALID', 'sandbox.hostname', `is "${name}", not an RFC 1123 host name of at most 64 bytes`);
  return name;
}

function checkDnsWords(values: readonly string[], field: string): void {
  values.forEach((v, i) => {
    if (v === '' || /[\s\0#;]/.test(v))
      throw fieldError('OCI_DNS_INVALID', `${field}[${i}]`, `is "${v}", which cannot be one resolv.conf word`);
  });
}

/** The etc files of the pod; a file the CRI request mounts itself is left out. */
export function etcFiles(
  sandbox: OciSandboxInput,
  guest: OciGuestLayout,
  hostname: string | undefined,
  mountedByRequest: ReadonlySet<string>,
): OciContainerFile[] {
  const dir = guest.etcDir.replace(/\/+$/, '');
  const files: OciContainerFile[] = [];
  if (hostname !== undefined) {
    files.push({ containerPath: '/etc/hostname', guestPath: `${dir}/hostname`, content: `${hostname}\n`, mode: 0o644 });
    const lines = ['127.0.0.1\tlocalhost', '::1\tlocalhost ip6-localhost ip6-loopback', `127.0.1.1\t${hostname}`];
    files.push({ containerPath: '/etc/hosts', guestPath: `${dir}/hosts`, content: `${lines.join('\n')}\n`, mode: 0o644 });
  }
  const dns = sandbox.dns_config;
  if (dns != null) {
    const servers = dns.servers ?? [];
    const searches = dns.searches ?? [];
    const options = dns.options ?? [];
    checkDnsWords(servers, 'sandbox.dns_config.servers');
    checkDnsWords(searches, 'sandbox.dns_config.searches');
    checkDnsWords(options, 'sandbox.dns_config.options');
    const lines = servers.map((s) => `nameserver ${s}`);
    if (searches.length > 0) lines.push(`search ${searches.join(' ')}`);
    if (options.length > 0) lines.push(`options ${options.join(' ')}`);
    files.push({
      containerPath: '/etc/resolv.conf',
      guestPath: `${dir}/resolv.conf`,
      content: lines.length > 0 ? `${lines.join('\n')}\n` : '',
      mode: 0o644,
    });
  }
  return files.filter((f) => !mountedByRequest.has(f.containerPath));
}

/** The bind mounts of the etc files; read-only when the root is, as the rest of the image is. */
export function etcMounts(files: readonly OciContainerFile[], readonlyRoot: boolean): OciMount[] {
  return files.map((f) => ({
    destination: f.containerPath,
    type: 'bind',
    source: f.guestPath,
    options: ['rbind', 'rprivate', readonlyRoot ? 'ro' : 'rw'],
  }));
}
