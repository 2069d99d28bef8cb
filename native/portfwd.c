/*
 * kata-ts-portfwd: containerd's port-forward door into a pod's guest (src/shim/port-forward.ts plans
 * and runs it; docs/shim.md#port-forward-behind-containerd says why it exists).
 *
 * containerd answers CRI PortForward by entering the pod's network namespace and dialling
 * 127.0.0.1:<port> there; behind kata-ts nothing listens in that namespace (the container listens
 * in the guest). The shim puts one iptables nat OUTPUT rule in the pod's namespace that REDIRECTs
 * tcp to 127.0.0.1 on lo to this helper's listener, and this helper, already in that namespace
 * (nsenter --net= before it), hands each connection to the shim:
 *   1. listens on 127.0.0.1, an ephemeral port, and prints that port as one line on stdout;
 *   2. per accepted connection (at most MAX_CONNECTIONS at once; more are reset), a child reads
 *      the port the client dialled (SO_ORIGINAL_DST: the destination before the REDIRECT),
 *      connects to the shim's unix socket (--socket, a path of the host's file system: unix
 *      sockets are not bound to a network namespace), writes that port as 2 bytes big endian, and
 *      relays both ways; the shim's first byte is a status: 0 the guest accepted the connection,
 *      anything else it refused, which the client hears as a reset;
 *   3. ends (children too) when stdin reaches end of file: the shim that started it is gone or
 *      stopped the door, so nothing of it outlives its owner.
 * The bytes it relays (the guest's, the client's) are never interpreted: one fixed buffer per
 * direction, blocking writes (backpressure), no allocation per byte.
 * Exits 125 with one line naming the step when it cannot start.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAIL_EXIT 125
#define MAX_CONNECTIONS 64
#define RELAY_BYTES 65536

static void fail(const char *step) {
  fprintf(stderr, "kata-ts-portfwd: %s: %s\n", step, strerror(errno));
  exit(FAIL_EXIT);
}

/* Close `fd` so that the peer sees a reset rather than an orderly end (a refused guest port). */
static void reset_close(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One connection, in its own child: ask the shim for the original port and relay. Never returns. */
static void serve_connection(int client, const char *socket_path) {
  struct sockaddr_in orig;
  socklen_t orig_len = sizeof orig;
  if (getsockopt(client, SOL_IP, SO_ORIGINAL_DST, &orig, &orig_len) != 0 || orig.sin_family != AF_INET) {
    reset_close(client);
    _exit(0);
  }
  int shim = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (shim < 0 || strlen(socket_path) >= sizeof addr.sun_path) {
    reset_close(client);
    _exit(0);
  }
  memcpy(addr.sun_path, socket_path, strlen(socket_path) + 1);
  unsigned char hello[2] = {(unsigned char)(ntohs(orig.sin_port) >> 8), (unsigned char)(ntohs(orig.sin_port) & 0xff)};
  if (connect(shim, (struct sockaddr *)&addr, sizeof addr) != 0 || write_all(shim, (const char *)hello, 2) != 0) {
    reset_close(client);
    _exit(0);
  }
  static char buf[RELAY_BYTES];
  int status_seen = 0;
  int client_open = 1, shim_open = 1;
  while (client_open || shim_open) {
    struct pollfd fds[2] = {{.fd = client_open ? client : -1, .events = POLLIN}, {.fd = shim_open ? shim : -1, .events = POLLIN}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) {
      ssize_t n = read(client, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        client_open = 0;
        shutdown(shim, SHUT_WR);
      } else if (write_all(shim, buf, (size_t)n) != 0) {
        break;
      }
    }
    if (fds[1].revents != 0) {
      ssize_t n = read(shim, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!status_seen) {
          /* The shim went before saying anything: the client hears a reset, not an empty reply. */
          reset_close(client);
          _exit(0);
        }
        shim_open = 0;
        shutdown(client, SHUT_WR);
        continue;
      }
      const char *data = buf;
      size_t len = (size_t)n;
      if (!status_seen) {
        status_seen = 1;
        if (buf[0] != 0) {
          reset_close(client);
          _exit(0);
        }
        data++;
        len--;
      }
      if (len > 0 && write_all(client, data, len) != 0) break;
    }
  }
  close(shim);
  close(client);
  _exit(0);
}

int main(int argc, char **argv) {
  const char *socket_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
      socket_path = argv[++i];
    } else {
      fprintf(stderr, "kata-ts-portfwd: unknown argument %s\n", argv[i]);
      return FAIL_EXIT;
    }
  }
  if (socket_path == NULL) {
    fprintf(stderr, "kata-ts-portfwd: --socket is required\n");
    return FAIL_EXIT;
  }
  signal(SIGPIPE, SIG_IGN);
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0) fail("socket");
  struct sockaddr_in local = {.sin_family = AF_INET, .sin_port = 0, .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
  if (bind(listener, (struct sockaddr *)&local, sizeof local) != 0) fail("bind 127.0.0.1");
  if (listen(listener, MAX_CONNECTIONS) != 0) fail("listen");
  socklen_t local_len = sizeof local;
  if (getsockname(listener, (struct sockaddr *)&local, &local_len) != 0) fail("getsockname");
  printf("%u\n", ntohs(local.sin_port));
  fflush(stdout);
  pid_t self = getpid();
  int children = 0;
  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) children--;
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = listener, .events = POLLIN}};
    /* Wake now and then to reap children even when nothing arrives. */
    if (poll(fds, 2, 1000) < 0 && errno != EINTR) fail("poll");
    if (fds[0].revents != 0) {
      char byte;
      if (read(0, &byte, 1) <= 0) break;
    }
    if (fds[1].revents == 0) continue;
    int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (children >= MAX_CONNECTIONS) {
      reset_close(client);
      continue;
    }
    pid_t pid = fork();
    if (pid == 0) {
      /* A relay ends with the helper: nothing of the door outlives the shim's stop. */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != self) _exit(0);
      close(listener);
      int flags = fcntl(client, F_GETFL);
      fcntl(client, F_SETFL, flags & ~O_NONBLOCK);
      serve_connection(client, socket_path);
    }
    if (pid > 0) children++;
    close(client);
  }
  return 0;
}
