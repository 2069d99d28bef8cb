/*
 * kata-ts-reaper: the per-process monitor of the guest agent (one per container init, one per exec).
 *
 * Why it exists: after `crun create` (or `crun exec --detach`) returns, the container's process is
 * no longer a child of whoever ran crun; the kernel reparents it to the nearest child subreaper.
 * Node cannot call prctl(PR_SET_CHILD_SUBREAPER) nor waitpid() a process it did not spawn, and
 * the exact wait status (exit 3, killed by SIGKILL, OOM) is only available to the parent. So the
 * agent spawns this program, which becomes a subreaper, runs the runtime command as its child,
 * learns the process id from the runtime's pid file and reports that process's wait status.
 *
 * With -t SOCKET it also receives the pty master that crun sends over SCM_RIGHTS on the console
 * socket (node cannot receive file descriptors) and copies master <-> its own stdin/stdout, so the
 * agent sees a terminal as two plain pipes; fd 4, when open, carries resize requests.
 *
 * With -s SPOOL the container's output does not go through the agent at all: the reaper makes
 * the pipes (or, with -t, reads the pty master) itself and appends what arrives to the file SPOOL
 * as frames (1 byte stream: 1 stdout, 2 stderr, 255 end of output; 4 bytes length, big endian;
 * the data). The agent tails that file, so output survives an agent restart (the reaper and the
 * file outlive the agent). Bounded: the agent writes "DATA_OFFSET FILE_OFFSET" of what the host
 * acknowledged to SPOOL.ack; while more than SPOOL_LIMIT bytes of the file are unacknowledged the
 * reaper stops reading, so the container blocks on a full pipe instead of filling guest memory.
 * Acknowledged bytes are released with fallocate(PUNCH_HOLE) (the file lives on tmpfs). The
 * reaper then stays until every writer has closed the pipes (or the pty hangs up), writes the
 * end frame and exits; the exit status is still reported when the watched process exits.
 *
 * usage: kata-ts-reaper [-t CONSOLE_SOCKET] [-s SPOOL] PID_FILE -- RUNTIME ARGS...
 *
 * fd 3 receives one line per event:
 *   pid N            the runtime succeeded; N is the process now watched
 *   runtime-exit N   the runtime command failed with exit code N (nothing is watched)
 *   runtime-signal N the runtime command was killed by signal N
 *   exit N           the watched process exited with code N
 *   signal N         the watched process was killed by signal N
 *   error TEXT       the reaper itself failed (TEXT names the step)
 * fd 4 (tty mode, optional): lines "ROWS COLS" set the terminal size.
 * The final "exit N" / "signal N" line is also written to PID_FILE.exit (atomically, by rename),
 * so an agent that restarted (and lost fd 3) still learns how the process ended.
 *
 * Build (static, no dependencies): gcc -static -Os -o kata-ts-reaper reaper.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/falloc.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define STATUS_FD 3
#define RESIZE_FD 4
#define SPOOL_LIMIT (1024 * 1024)
#define SPOOL_STDOUT 1
#define SPOOL_STDERR 2
#define SPOOL_END 255

/* The spool (-s): fd, bytes written, and the acknowledged file offset read from SPOOL.ack. */
static int spool_fd = -1;
static const char *spool_ack_path;
static long long spool_written, spool_acked, spool_punched, spool_checked;

static void report(const char *fmt, long value) {
  char line[64];
  int n = snprintf(line, sizeof line, fmt, value);
  if (n > 0) (void)!write(STATUS_FD, line, (size_t)n);
}

static void fail(const char *step) {
  char line[128];
  int n = snprintf(line, sizeof line, "error %s: %s\n", step, strerror(errno));
  if (n > 0) (void)!write(STATUS_FD, line, (size_t)n);
  exit(1);
}

static int listen_console(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    fail("console socket path");
  }
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  unlink(path);
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) fail("bind");
  if (listen(fd, 1) < 0) fail("listen");
  return fd;
}

/* crun connects and sends the master before it exits, so the message waits in the backlog. */
static int receive_master(int listener) {
  int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (conn < 0) fail("accept console");
  char data[256];
  char control[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = data, .iov_len = sizeof data};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
  if (recvmsg(conn, &msg, MSG_CMSG_CLOEXEC) < 0) fail("recvmsg console");
  struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == NULL || cmsg->cmsg_type != SCM_RIGHTS) {
    errno = EPROTO;
    fail("console message");
  }
  int master;
  memcpy(&master, CMSG_DATA(cmsg), sizeof master);
  close(conn);
  return master;
}

static const char *exit_file;

static void report_status(int status) {
  char line[64];
  int n = WIFSIGNALED(status) ? snprintf(line, sizeof line, "signal %d\n", WTERMSIG(status))
                              : snprintf(line, sizeof line, "exit %d\n", WEXITSTATUS(status));
  if (n <= 0) return;
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", exit_file) < (int)sizeof tmp) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      (void)!write(fd, line, (size_t)n);
      close(fd);
      (void)!rename(tmp, exit_file);
    }
  }
  (void)!write(STATUS_FD, line, (size_t)n);
}

static int write_all(int fd, const char *buf, ssize_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, (size_t)len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    buf += n;
    len -= n;
  }
  return 0;
}

static void spool_refresh(void);

static void spool_frame(int stream, const char *buf, ssize_t len) {
  unsigned char head[5] = {(unsigned char)stream, (unsigned char)(len >> 24), (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                           (unsigned char)len};
  /* One writev: the agent wakes once per frame (inotify), not once for the header. */
  struct iovec iov[2] = {{.iov_base = head, .iov_len = 5}, {.iov_base = (void *)buf, .iov_len = (size_t)len}};
  ssize_t n = writev(spool_fd, iov, len > 0 ? 2 : 1);
  if (n < 0 && errno != EINTR) fail("write spool");
  if (n < 0) n = 0;
  /* A short write (rare on tmpfs): the rest in order. */
  if (n < 5 && write_all(spool_fd, (const char *)head + n, 5 - n) < 0) fail("write spool");
  ssize_t done = n > 5 ? n - 5 : 0;
  if (len > done && write_all(spool_fd, buf + done, len - done) < 0) fail("write spool");
  spool_written += 5 + len;
  /* Release what the host stored every 64 KiB of output, not only when the spool is full. */
  if (spool_written - spool_checked >= 64 * 1024) spool_refresh();
}

/* Output of the container: to the spool when there is one, else to our stdout (the agent's pipe). */
static void output(int stream, const char *buf, ssize_t len) {
  if (spool_fd >= 0)
    spool_frame(stream, buf, len);
  else
    (void)write_all(stream == SPOOL_STDERR ? 2 : 1, buf, len);
}

/* Re-read SPOOL.ack and release what the host has stored. */
static void spool_refresh(void) {
  char text[64];
  spool_checked = spool_written;
  int fd = open(spool_ack_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return;
  text[n] = 0;
  long long data, file;
  if (sscanf(text, "%lld %lld", &data, &file) != 2 || file < spool_acked || file > spool_written) return;
  spool_acked = file;
  long long upto = spool_acked & ~4095LL;
  if (upto > spool_punched) {
    (void)fallocate(spool_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, spool_punched, upto - spool_punched);
    spool_punched = upto;
  }
}

/* May the reaper read more output? Without a spool the agent's pipe throttles instead. */
static int spool_has_room(void) {
  if (spool_fd < 0) return 1;
  if (spool_written - spool_acked < SPOOL_LIMIT) return 1;
  spool_refresh();
  return spool_written - spool_acked < SPOOL_LIMIT;
}

static void apply_resize(int master, char *line) {
  unsigned rows, cols;
  if (sscanf(line, "%u %u", &rows, &cols) == 2) {
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    (void)ioctl(master, TIOCSWINSZ, &ws);
  }
}

/* Reap every child; return 1 and the status once the watched one is gone. */
static int reap(pid_t watched, int *status) {
  for (;;) {
    int st;
    pid_t w = waitpid(-1, &st, WNOHANG);
    if (w == 0) return 0;
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == ECHILD) fail("watched process lost");
      fail("waitpid");
    }
    if (w == watched) {
      *status = st;
      return 1;
    }
  }
}

static void proxy_tty(int master, pid_t watched) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) fail("signalfd");
  int resize_open = fcntl(RESIZE_FD, F_GETFD) >= 0;
  int stdin_open = 1;
  char buf[16384], line[64];
  size_t line_len = 0;
  int status;
  int master_open = 1;
  for (;;) {
    if (reap(watched, &status)) break;
    int room = spool_has_room();
    struct pollfd fds[4] = {
        {.fd = sfd, .events = POLLIN},
        {.fd = master_open && room ? master : -1, .events = POLLIN},
        {.fd = stdin_open ? 0 : -1, .events = POLLIN},
        {.fd = resize_open ? RESIZE_FD : -1, .events = POLLIN},
    };
    /* A full spool is re-checked every 100 ms: the agent acknowledges through SPOOL.ack. */
    if (poll(fds, 4, room ? -1 : 100) < 0) {
      if (errno == EINTR) continue;
      fail("poll");
    }
    if (fds[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
    }
    if (fds[1].revents) {
      ssize_t n = read(master, buf, sizeof buf);
      if (n > 0)
        output(SPOOL_STDOUT, buf, n);
      else if (n < 0 && errno != EINTR && errno != EAGAIN)
        master_open = 0; /* EIO: every slave side is closed; the exit comes with SIGCHLD */
    }
    if (fds[2].revents) {
      ssize_t n = read(0, buf, sizeof buf);
      if (n > 0)
        (void)write_all(master, buf, n);
      else
        stdin_open = 0;
    }
    if (fds[3].revents) {
      ssize_t n = read(RESIZE_FD, line + line_len, sizeof line - 1 - line_len);
      if (n <= 0) {
        resize_open = 0;
        continue;
      }
      line_len += (size_t)n;
      line[line_len] = 0;
      char *nl;
      while ((nl = strchr(line, '\n')) != NULL) {
        *nl = 0;
        apply_resize(master, line);
        line_len -= (size_t)(nl + 1 - line);
        memmove(line, nl + 1, line_len + 1);
      }
      if (line_len == sizeof line - 1) line_len = 0;
    }
  }
  /* The process is gone: whatever it wrote is still in the master, copy it out before EOF. */
  fcntl(master, F_SETFL, O_NONBLOCK);
  for (;;) {
    ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;
    output(SPOOL_STDOUT, buf, n);
  }
  report_status(status);
  if (spool_fd >= 0) spool_frame(SPOOL_END, NULL, 0);
}

/*
 * -s without a terminal: copy the container's stdout/stderr pipes into the spool. The exit is
 * reported when the watched process ends; copying goes on until every writer closed the pipes.
 */
static void relay_pipes(int out, int err, pid_t watched) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) fail("signalfd");
  char buf[16384];
  int fds_open[2] = {out, err};
  int exited = 0, status;
  while (fds_open[0] >= 0 || fds_open[1] >= 0 || !exited) {
    if (!exited && reap(watched, &status)) {
      exited = 1;
      report_status(status);
      continue;
    }
    if (exited) {
      int st;
      while (waitpid(-1, &st, WNOHANG) > 0) {
      }
    }
    int room = spool_has_room();
    struct pollfd fds[3] = {
        {.fd = sfd, .events = POLLIN},
        {.fd = room ? fds_open[0] : -1, .events = POLLIN},
        {.fd = room ? fds_open[1] : -1, .events = POLLIN},
    };
    if (poll(fds, 3, room ? -1 : 100) < 0) {
      if (errno == EINTR) continue;
      fail("poll");
    }
    if (fds[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
    }
    for (int k = 0; k < 2; k++) {
      if (!fds[k + 1].revents) continue;
      ssize_t n = read(fds_open[k], buf, sizeof buf);
      if (n > 0) {
        output(k == 0 ? SPOOL_STDOUT : SPOOL_STDERR, buf, n);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(fds_open[k]);
        fds_open[k] = -1;
      }
    }
  }
  spool_frame(SPOOL_END, NULL, 0);
}

int main(int argc, char **argv) {
  const char *console = NULL;
  int i = 1;
  const char *spool = NULL;
  while (i + 1 < argc && (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "-s") == 0)) {
    if (argv[i][1] == 't')
      console = argv[i + 1];
    else
      spool = argv[i + 1];
    i += 2;
  }
  if (i + 2 >= argc || strcmp(argv[i + 1], "--") != 0) {
    fprintf(stderr, "usage: kata-ts-reaper [-t CONSOLE_SOCKET] [-s SPOOL] PID_FILE -- RUNTIME ARGS...\n");
    return 2;
  }
  const char *pid_file = argv[i];
  char **runtime = argv + i + 2;
  static char exit_path[4096];
  if (snprintf(exit_path, sizeof exit_path, "%s.exit", pid_file) >= (int)sizeof exit_path) return 2;
  exit_file = exit_path;
  if (fcntl(STATUS_FD, F_GETFD) < 0) return 2;
  fcntl(STATUS_FD, F_SETFD, FD_CLOEXEC);
  if (fcntl(RESIZE_FD, F_GETFD) >= 0) fcntl(RESIZE_FD, F_SETFD, FD_CLOEXEC);
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) fail("prctl subreaper");
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int listener = console ? listen_console(console) : -1;
  static char ack_path[4096];
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (spool) {
    if (snprintf(ack_path, sizeof ack_path, "%s.ack", spool) >= (int)sizeof ack_path) return 2;
    spool_ack_path = ack_path;
    /* O_APPEND: a restarted reaper never runs for the same spool, but never overwrite either. */
    spool_fd = open(spool, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (spool_fd < 0) fail("open spool");
    if (!console && (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0)) fail("pipe");
  }

  pid_t child = fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    sigprocmask(SIG_UNBLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (console) {
      /* With a terminal the container's stdio is the pty; crun's own output goes to its log. */
      int devnull = open("/dev/null", O_RDWR);
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
    } else if (spool) {
      /* The container writes into the reaper's pipes (dup2 clears close-on-exec on 1 and 2). */
      dup2(out_pipe[1], 1);
      dup2(err_pipe[1], 2);
    }
    execvp(runtime[0], runtime);
    _exit(127);
  }
  if (spool && !console) {
    close(out_pipe[1]);
    close(err_pipe[1]);
  }
  if (!console) {
    /* Do not hold the container's pipes: EOF must come when the container closes them. */
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
  }
  int status;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) fail("waitpid runtime");
  }
  if (WIFSIGNALED(status)) {
    report("runtime-signal %ld\n", WTERMSIG(status));
    return 1;
  }
  if (WEXITSTATUS(status) != 0) {
    report("runtime-exit %ld\n", WEXITSTATUS(status));
    return 1;
  }
  FILE *f = fopen(pid_file, "r");
  long pid = 0;
  if (f == NULL || fscanf(f, "%ld", &pid) != 1 || pid <= 0) fail("read pid file");
  fclose(f);
  report("pid %ld\n", pid);
  if (spool && !console) {
    relay_pipes(out_pipe[0], err_pipe[0], (pid_t)pid);
    return 0;
  }

  if (console) {
    int master = receive_master(listener);
    close(listener);
    unlink(console);
    proxy_tty(master, (pid_t)pid);
    return 0;
  }
  for (;;) {
    int st;
    pid_t w = waitpid(-1, &st, 0);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("watched process lost");
    }
    if (w == (pid_t)pid) {
      report_status(st);
      return 0;
    }
  }
}
