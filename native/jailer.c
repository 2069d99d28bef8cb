/*
 * kata-ts-jailer: the last root step before a confined QEMU runs (src/hypervisor/confine.ts plans its
 * arguments; docs/security.md#the-vmm-jail says why it exists).
 *
 * Runs as root, already in the pod's network namespace when it has one (nsenter --net= before it),
 * and then, in this order, in the same process (no fork: the pid the runtime spawned stays QEMU's):
 *   0. with --oom-score-adj, raises its OOM score adjustment to that value when it is lower (the
 *      daemon's unit protects the daemon with a negative one, which QEMU must not inherit; raising
 *      needs no capability, lowering would);
 *   1. unshares a network namespace when --new-netns is given (a pod without a network still gets
 *      an empty namespace of its own: no loopback services, no abstract sockets, no route out), and
 *      always a mount and an IPC namespace (no SysV IPC or POSIX mqueue of the host's);
 *   2. makes every mount private (nothing propagates back to the host), pivot_roots into the jail
 *      (already a mount point: the runtime bound it onto itself), detaches the old root, and
 *      changes directory to the new root, so no directory of the host is reachable by any path,
 *      relative or absolute, nor through the working directory;
 *   3. sets each --rlimit (soft = hard: the unprivileged QEMU cannot raise them again);
 *   4. with --wait-fd, waits for one byte there: the runtime puts this process in the pod's cgroup
 *      meanwhile, so QEMU (and anything it could fork) starts inside it and its pids.max; end of
 *      file instead (the runtime gave up) exits without running anything;
 *   5. closes every descriptor from --keep-fds on (only what the runtime meant to hand QEMU);
 *   6. execs the rest of its arguments (setpriv, found inside the jail, drops to QEMU's identity).
 * Every failure prints one line naming the step and exits 125, before QEMU exists.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FAIL_EXIT 125
#define MAX_RLIMITS 16

static void die(const char *step, const char *what) {
  fprintf(stderr, "kata-ts-jailer: %s%s%s: %s\n", step, what ? " " : "", what ? what : "", strerror(errno));
  exit(FAIL_EXIT);
}

static void usage(const char *why) {
  fprintf(stderr,
          "kata-ts-jailer: %s\nusage: kata-ts-jailer --root=DIR [--new-netns] "
          "[--rlimit=NAME=LIMIT]... [--keep-fds=N] [--wait-fd=N] [--oom-score-adj=N] -- PROGRAM [ARG]...\n",
          why);
  exit(FAIL_EXIT);
}

struct rlimit_arg {
  int resource;
  rlim_t limit;
};

static int resource_of(const char *name) {
  if (strcmp(name, "nofile") == 0) return RLIMIT_NOFILE;
  if (strcmp(name, "memlock") == 0) return RLIMIT_MEMLOCK;
  if (strcmp(name, "core") == 0) return RLIMIT_CORE;
  if (strcmp(name, "nproc") == 0) return RLIMIT_NPROC;
  if (strcmp(name, "fsize") == 0) return RLIMIT_FSIZE;
  if (strcmp(name, "msgqueue") == 0) return RLIMIT_MSGQUEUE;
  return -1;
}

static int parse_u64(const char *text, unsigned long long *out) {
  char *end = NULL;
  if (*text < '0' || *text > '9') return -1;
  errno = 0;
  *out = strtoull(text, &end, 10);
  return errno != 0 || *end != '\0' ? -1 : 0;
}

/* /proc/self/oom_score_adj up to `target` (never down: that takes CAP_SYS_RESOURCE). */
static void raise_oom_score_adj(int target) {
  char text[16] = "";
  int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
  if (fd < 0) die("opening", "/proc/self/oom_score_adj");
  ssize_t got = read(fd, text, sizeof text - 1);
  if (got <= 0) die("reading", "/proc/self/oom_score_adj");
  if (atoi(text) < target) {
    int len = snprintf(text, sizeof text, "%d\n", target);
    if (pwrite(fd, text, (size_t)len, 0) != len) die("writing", "/proc/self/oom_score_adj");
  }
  close(fd);
}

int main(int argc, char **argv) {
  const char *root = NULL;
  struct rlimit_arg limits[MAX_RLIMITS];
  int nlimits = 0, new_netns = 0, keep_fds = 3, wait_fd = -1, oom_adj = 0, set_oom_adj = 0, i;

  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strncmp(a, "--root=", 7) == 0) {
      root = a + 7;
    } else if (strcmp(a, "--new-netns") == 0) {
      new_netns = 1;
    } else if (strncmp(a, "--keep-fds=", 11) == 0) {
      unsigned long long n;
      if (parse_u64(a + 11, &n) != 0 || n < 3 || n > 64) usage("--keep-fds must be a number from 3 to 64");
      keep_fds = (int)n;
    } else if (strncmp(a, "--oom-score-adj=", 16) == 0) {
      char *end = NULL;
      long n = strtol(a + 16, &end, 10);
      if (end == a + 16 || *end != '\0' || n < -1000 || n > 1000) usage("--oom-score-adj must be a number from -1000 to 1000");
      oom_adj = (int)n;
      set_oom_adj = 1;
    } else if (strncmp(a, "--wait-fd=", 10) == 0) {
      unsigned long long n;
      if (parse_u64(a + 10, &n) != 0 || n < 3 || n > 63) usage("--wait-fd must be a number from 3 to 63");
      wait_fd = (int)n;
    } else if (strncmp(a, "--rlimit=", 9) == 0) {
      char name[16];
      const char *eq = strchr(a + 9, '=');
      unsigned long long n;
      size_t len = eq == NULL ? 0 : (size_t)(eq - (a + 9));
      if (eq == NULL || len == 0 || len >= sizeof name) usage("--rlimit takes NAME=LIMIT");
      memcpy(name, a + 9, len);
      name[len] = '\0';
      if (nlimits == MAX_RLIMITS) usage("too many --rlimit");
      limits[nlimits].resource = resource_of(name);
      if (limits[nlimits].resource < 0) usage("unknown --rlimit name");
      if (parse_u64(eq + 1, &n) != 0) usage("--rlimit LIMIT must be a number");
      limits[nlimits++].limit = (rlim_t)n;
    } else {
      usage("unknown option");
    }
  }
  if (root == NULL || root[0] != '/') usage("--root must be an absolute path");
  if (i >= argc) usage("no program to run");

  if (set_oom_adj) raise_oom_score_adj(oom_adj);

  if (new_netns && unshare(CLONE_NEWNET) != 0) die("unsharing the network namespace", NULL);
  if (unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0) die("unsharing the mount and IPC namespaces", NULL);
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("making mounts private", NULL);
  if (chdir(root) != 0) die("entering", root);
  /* pivot_root(".", "."): the old root ends up mounted on top of the new one; detaching it leaves
   * the jail as the only tree this namespace has (the idiom runc uses, see pivot_root(2)). */
  if (syscall(SYS_pivot_root, ".", ".") != 0) die("pivot_root into", root);
  if (umount2(".", MNT_DETACH) != 0) die("detaching the old root", NULL);
  if (chdir("/") != 0) die("entering the new root", NULL);

  for (int l = 0; l < nlimits; l++) {
    struct rlimit rl = {limits[l].limit, limits[l].limit};
    if (setrlimit(limits[l].resource, &rl) != 0) die("setting a resource limit", NULL);
  }

  if (wait_fd >= 0) {
    char go;
    ssize_t got;
    do got = read(wait_fd, &go, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1) {
      if (got == 0) errno = ECANCELED;
      die("waiting for the runtime to place the VMM", NULL);
    }
    close(wait_fd);
  }

#ifdef SYS_close_range
  if (syscall(SYS_close_range, (unsigned)keep_fds, ~0U, 0) != 0 && errno != ENOSYS) die("closing inherited descriptors", NULL);
#endif
  execv(argv[i], &argv[i]);
  die("executing", argv[i]);
  return FAIL_EXIT;
}
