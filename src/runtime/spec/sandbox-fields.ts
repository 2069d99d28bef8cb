/**
 * The pod request fields that reach CNI or files the runtime writes, checked against their real
 * grammar before anything is planned (pure): port mappings go to the portmap plugin as JSON
 * (`runtimeConfig.portMappings`, where a protocol is an enum and a port a 16-bit number),
 * dns_config becomes the lines of the pod's resolv.conf, sysctls become paths under the guest's
 * /proc/sys. Each function returns every problem; `refuseFields` throws the first one.
 */
import { invalid, type Reason } from '../../common/errors.js';
import type { DNSConfig__Output } from '../../generated/runtime/v1/DNSConfig.js';
import type { PortMapping__Output } from '../../generated/runtime/v1/PortMapping.js';

/** One thing wrong with a field: the code and one sentence naming the field. */
export interface FieldProblem {
  reason: Reason;
  message: string;
}

/** The CRI's Protocol enum as grpc-js decodes it (by name); anything else is a number it did not know. */
export const PORT_PROTOCOLS = ['TCP', 'UDP', 'SCTP'] as const;
const MAX_PORT = 65_535;
/** The kubelet never sends more (a pod's ports); a bound keeps one request from flooding iptables. */
export const MAX_PORT_MAPPINGS = 1024;
/** glibc reads at most 3 nameservers and 6 search domains; a few more are tolerated, not thousands. */
export const MAX_DNS_ENTRIES = 32;
/** A resolv.conf line is read in 256-byte chunks by old resolvers; a search domain is a DNS name (253). */
const MAX_DNS_WORD_BYTES = 253;
/** Kubernetes' sysctl name grammar (pkg/apis/core/validation: SysctlContainSlashRegexp), any segment separator. */
const SYSCTL_NAME = /^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$/;
const MAX_SYSCTL_NAME_BYTES = 253;
const MAX_SYSCTL_VALUE_BYTES = 4096;
/** Whitespace or a control character: each would end a resolv.conf word or line, or a /proc/sys write. */
const BREAKS_WORD = /[\s\p{Cc}]/u;

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const HEXTET = /^[0-9A-Fa-f]{1,4}$/;

/** An IPv4 dotted quad or an IPv6 address (RFC 4291 text forms, an embedded IPv4 tail included, no zone): what Go's net.ParseIP takes. */
export function isIpAddress(s: string): boolean {
  if (IPV4.test(s)) return true;
  if (s.length > 45 || !s.includes(':')) return false;
  const halves = s.split('::');
  if (halves.length > 2) return false;
  const groups = halves.map((h) => (h === '' ? [] : h.split(':')));
  const all = groups.flat();
  const last = all.at(-1) ?? '';
  // An IPv4 tail takes the place of two groups, and only at the very end.
  const v4Tail = last.includes('.') && groups.at(-1)?.at(-1) === last;
  if (v4Tail && !IPV4.test(last)) return false;
  const hextets = v4Tail ? all.slice(0, -1) : all;
  if (!hextets.every((g) => HEXTET.test(g))) return false;
  const count = hextets.length + (v4Tail ? 2 : 0);
  return halves.length === 2 ? count <= 7 : count === 8;
}

function portProblems(p: PortMapping__Output, field: string): FieldProblem[] {
  const reason: Reason = 'SANDBOX_PORT_MAPPING_INVALID';
  const out: FieldProblem[] = [];
  const protocol = p.protocol as unknown;
  if (!(PORT_PROTOCOLS as readonly unknown[]).includes(protocol))
    out.push({ reason, message: `${field}.protocol is ${JSON.stringify(protocol)}; it must be one of ${PORT_PROTOCOLS.join(', ')}` });
  const port = (name: 'container_port' | 'host_port', min: number) => {
    const v = p[name];
    if (!Number.isInteger(v) || v < min || v > MAX_PORT)
      out.push({ reason, message: `${field}.${name} is ${v}; it must be ${min} to ${MAX_PORT}` });
  };
  port('container_port', 1);
  // 0: no host port (the mapping is only declared, nothing is published).
  port('host_port', 0);
  if (p.host_ip !== '' && !isIpAddress(p.host_ip))
    out.push({ reason, message: `${field}.host_ip ${JSON.stringify(p.host_ip.slice(0, 64))} is not an IP address` });
  return out;
}

/** Every problem with the pod's port mappings (`field`: how the request names the list). */
export function portMappingProblems(mappings: readonly PortMapping__Output[], field: string): FieldProblem[] {
  if (mappings.length > MAX_PORT_MAPPINGS)
    return [
      {
        reason: 'SANDBOX_PORT_MAPPING_INVALID',
        message: `${field} has ${mappings.length} entries; at most ${MAX_PORT_MAPPINGS} are allowed`,
      },
    ];
  return mappings.flatMap((p, i) => portProblems(p, `${field}[${i}]`));
}

/**
 * Every problem with dns_config: servers are IP addresses, searches and options single words
 * (a space or newline would add a line, `nameserver` included, to the pod's resolv.conf).
 */
export function dnsConfigProblems(dns: DNSConfig__Output | null, field: string): FieldProblem[] {
  if (dns === null) return [];
  const reason: Reason = 'SANDBOX_DNS_CONFIG_INVALID';
  const out: FieldProblem[] = [];
  for (const [name, list] of [
    ['servers', dns.servers],
    ['searches', dns.searches],
    ['options', dns.options],
  ] as const) {
    if (list.length > MAX_DNS_ENTRIES) {
      out.push({ reason, message: `${field}.${name} has ${list.length} entries; at most ${MAX_DNS_ENTRIES} are allowed` });
      continue;
    }
    for (const [i, v] of list.entries()) {
      const at = `${field}.${name}[${i}]`;
      if (name === 'servers' ? !isIpAddress(v) : v === '' || BREAKS_WORD.test(v) || Buffer.byteLength(v) > MAX_DNS_WORD_BYTES)
        out.push({
          reason,
          message:
            name === 'servers'
              ? `${at} ${JSON.stringify(v.slice(0, 64))} is not an IP address`
              : `${at} ${JSON.stringify(v.slice(0, 64))} must be one word of at most ${MAX_DNS_WORD_BYTES} bytes (no space or control character)`,
        });
    }
  }
  return out;
}

/** Every problem with the pod's sysctls: Kubernetes' name grammar (never a "..", a path or a blank), values one line. */
export function sysctlProblems(sysctls: Readonly<Record<string, string>>, field: string): FieldProblem[] {
  const reason: Reason = 'SANDBOX_SYSCTL_INVALID';
  const out: FieldProblem[] = [];
  for (const [name, value] of Object.entries(sysctls)) {
    if (Buffer.byteLength(name) > MAX_SYSCTL_NAME_BYTES || !SYSCTL_NAME.test(name))
      out.push({ reason, message: `${field} key ${JSON.stringify(name.slice(0, 64))} is not a sysctl name` });
    else if (Buffer.byteLength(value) > MAX_SYSCTL_VALUE_BYTES || /[\p{Cc}]/u.test(value.replace(/\t/g, ' ')))
      out.push({
        reason,
        message: `${field} value of ${JSON.stringify(name)} must be one line of at most ${MAX_SYSCTL_VALUE_BYTES} bytes`,
      });
  }
  return out;
}

/** Throw INVALID_ARGUMENT for the first problem, saying how many more there are; nothing for none. */
export function refuseFields(problems: readonly FieldProblem[]): void {
  const [first] = problems;
  if (first === undefined) return;
  const more = problems.length - 1;
  throw invalid(first.reason, more === 0 ? first.message : `${first.message} (and ${more} more)`, {
    details: { problems: problems.length },
  });
}
