/**
 * kata-ts's RuntimeDefault seccomp profile, written as data.
 *
 * Choice: default ALLOW with a deny list, not default ERRNO with an allow list. Inside a pod VM
 * the guest kernel, not the host's, is what a container can attack, so the profile's job is to
 * close the kernel interfaces a container has no business with (module loading, kexec, keyrings,
 * io_uring, new namespaces, clock setting, raw I/O ports...) rather than to enumerate the 350
 * syscalls ordinary programs use: a deny list stays right when a new libc starts using a new
 * syscall, where an allow list breaks it. Most groups are denied only while the container lacks
 * the capability that would make the call legitimate, so adding that capability to a container
 * also lets its syscalls through, as users expect from the runtimes they know.
 */
import type { OciSeccomp, OciSeccompSyscall } from './spec-types.js';

const EPERM = 1;
const ENOSYS = 38;

interface DenyGroup {
  /** Why these are closed, for the reader of this table. */
  why: string;
  syscalls: string[];
  /** Allowed when the container holds any of these capabilities. */
  unlessAnyCap?: string[];
  /** The errno returned; EPERM unless the caller must see "not implemented" to fall back. */
  errno?: number;
}

export const DEFAULT_DENY_GROUPS: readonly DenyGroup[] = [
  {
    why: 'obsolete or host-only interfaces no container uses',
    syscalls: [
      'create_module',
      'get_kernel_syms',
      'query_module',
      'nfsservctl',
      'uselib',
      '_sysctl',
      'sysfs',
      'ustat',
      'vm86',
      'vm86old',
      'lookup_dcookie',
    ],
  },
  { why: 'replacing the running kernel', syscalls: ['kexec_load', 'kexec_file_load'] },
  { why: 'kernel keyrings are not namespaced', syscalls: ['add_key', 'request_key', 'keyctl'] },
  { why: 'large, often-patched kernel surfaces', syscalls: ['io_uring_setup', 'io_uring_enter', 'io_uring_register', 'userfaultfd'] },
  { why: 'loading kernel modules', syscalls: ['init_module', 'finit_module', 'delete_module'], unlessAnyCap: ['CAP_SYS_MODULE'] },
  { why: 'rebooting the VM under the other containers', syscalls: ['reboot'], unlessAnyCap: ['CAP_SYS_BOOT'] },
  {
    why: 'mounts, namespaces and swap change what the pod shares',
    syscalls: [
      'mount',
      'umount',
      'umount2',
      'pivot_root',
      'setns',
      'unshare',
      'swapon',
      'swapoff',
      'quotactl',
      'quotactl_fd',
      'fanotify_init',
      'fsopen',
      'fsconfig',
      'fsmount',
      'fspick',
      'move_mount',
      'open_tree',
      'mount_setattr',
      'sethostname',
      'setdomainname',
      'vhangup',
    ],
    unlessAnyCap: ['CAP_SYS_ADMIN'],
  },
  {
    why: 'clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone',
    syscalls: ['clone3'],
    unlessAnyCap: ['CAP_SYS_ADMIN'],
    errno: ENOSYS,
  },
  {
    why: 'setting the clock of every container in the VM',
    syscalls: ['settimeofday', 'stime', 'clock_settime', 'clock_settime64', 'clock_adjtime', 'clock_adjtime64'],
    unlessAnyCap: ['CAP_SYS_TIME'],
  },
  { why: 'raw I/O ports', syscalls: ['iopl', 'ioperm'], unlessAnyCap: ['CAP_SYS_RAWIO'] },
  { why: 'process accounting', syscalls: ['acct'], unlessAnyCap: ['CAP_SYS_PACCT'] },
  { why: 'the kernel log', syscalls: ['syslog'], unlessAnyCap: ['CAP_SYSLOG'] },
  { why: 'comparing kernel objects of other processes', syscalls: ['kcmp'], unlessAnyCap: ['CAP_SYS_PTRACE'] },
  { why: 'opening files by handle escapes mount restrictions', syscalls: ['open_by_handle_at'], unlessAnyCap: ['CAP_DAC_READ_SEARCH'] },
  {
    why: 'NUMA placement of other processes',
    syscalls: ['mbind', 'set_mempolicy', 'migrate_pages', 'move_pages'],
    unlessAnyCap: ['CAP_SYS_NICE'],
  },
  { why: 'BPF programs', syscalls: ['bpf'], unlessAnyCap: ['CAP_SYS_ADMIN', 'CAP_BPF'] },
  { why: 'performance counters', syscalls: ['perf_event_open'], unlessAnyCap: ['CAP_SYS_ADMIN', 'CAP_PERFMON'] },
];

/** clone() flags that create namespaces; each is refused on its own (the rule's args are ANDed). */
const CLONE_NAMESPACE_FLAGS: readonly number[] = [
  0x00020000, // CLONE_NEWNS
  0x02000000, // CLONE_NEWCGROUP
  0x04000000, // CLONE_NEWUTS
  0x08000000, // CLONE_NEWIPC
  0x10000000, // CLONE_NEWUSER
  0x20000000, // CLONE_NEWPID
  0x40000000, // CLONE_NEWNET
];

/** The architectures a pod VM (x86_64) can execute. */
export const SECCOMP_ARCHITECTURES: readonly string[] = ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'];

/** The RuntimeDefault profile for a container holding `capabilities` (its bounding set). */
export function runtimeDefaultProfile(capabilities: readonly string[]): OciSeccomp {
  const held = new Set(capabilities);
  const syscalls: OciSeccompSyscall[] = [];
  for (const group of DEFAULT_DENY_GROUPS) {
    if (group.unlessAnyCap?.some((c) => held.has(c))) continue;
    syscalls.push({ names: [...group.syscalls], action: 'SCMP_ACT_ERRNO', errnoRet: group.errno ?? EPERM });
  }
  if (!held.has('CAP_SYS_ADMIN')) {
    for (const flag of CLONE_NAMESPACE_FLAGS) {
      // x86 passes clone's flags in the first argument; MASKED_EQ: (arg0 & value) == valueTwo.
      syscalls.push({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }],
      });
    }
  }
  return { defaultAction: 'SCMP_ACT_ALLOW', architectures: [...SECCOMP_ARCHITECTURES], syscalls };
}
