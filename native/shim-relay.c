/*
 * kata-ts-shim-relay: the per-pod process containerd is connected to when the shim runs in node
 * mode, started by the node shim (src/shim/node-relay.ts); docs/shim.md#the-relay says why it
 * exists and what it promises.
 *
 * containerd cleans up a task when its connection to the task's shim closes, so the process that
 * holds that connection must be small, simple and never need a restart. This one holds no pod
 * state: it listens on the pod's socket (--listen) and hands ttrpc frames, whole, to the node
 * shim server's per-pod socket (--upstream), and the answers back.
 *   - every accepted downstream connection gets its own upstream connection;
 *   - frames are forwarded whole (10-byte header: u32 BE data length, u32 BE stream id, u8 type,
 *     u8 flags; then the data). A downstream frame over 4 MiB (ttrpc's own cap) closes that
 *     downstream; an upstream one is skipped unread and its request answered RESOURCE_EXHAUSTED;
 *   - every request (type 1) forwarded and not yet answered (type 2 on its stream id) is kept with
 *     its bytes. When the upstream connection fails, the downstream one stays open: the relay
 *     reconnects (backoff 50 ms doubling to 1 s), sends the unanswered requests again in their
 *     order, then goes on. Meanwhile new downstream frames queue up, at most 16 MiB per connection
 *     (unanswered and queued bytes together), beyond which that downstream is closed;
 *   - revive: once the upstream has refused connections for 1 s, the argv after `--` is started
 *     (setsid, stdin/stdout /dev/null, stderr ours), then again at most once per 10 s;
 *   - it exits 0 when `<upstream>.gone` exists and no request is unanswered (checked on every
 *     upstream failure and every second), and on SIGTERM.
 * Everything either side sends is untrusted: lengths are checked before anything is allocated,
 * buffers grow only as bytes really arrive, and every byte held counts against a per-connection
 * and a process-wide bound. One thread, ppoll(2), non-blocking sockets.
 * Exits 125 with one line naming the step when it cannot start.
 *
 * `kata-ts-shim-relay --hold <container id>` is a second, smaller job (src/shim/node-output-holder.ts):
 * it is started with a container's stdout and stderr FIFOs (containerd's) as its descriptors 1 and
 * 2, opened write-only, and does nothing but keep them open. containerd stops copying a FIFO once
 * every writer has closed it; in node mode the writer is the node server, so without a holder a
 * crash of the server would end the container's log for good. It exits on SIGTERM (the server
 * releases it once the container's output reached its end) or once no FIFO it holds has a reader
 * left (containerd closed them: nobody is to be kept reading). It never writes a byte.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL_EXIT 125
#define HEADER_BYTES 10
#define TYPE_REQUEST 1
#define TYPE_RESPONSE 2
/* ttrpc's own cap on a frame's data (4 << 20). */
#define MAX_DATA_BYTES (4u << 20)
/* Requests unanswered plus frames queued, per connection, before its downstream is closed. */
#define MAX_HELD_BYTES (16u << 20)
/* Everything held by all connections together (frames, partial frames, answers on their way). */
#define MAX_TOTAL_BYTES (64u << 20)
/* Bytes written to the upstream not yet taken, before the downstream is read no further. */
#define MAX_UNSENT_BYTES (1u << 20)
/* Answers waiting for a slow downstream, before the upstream is read no further. */
#define MAX_ANSWER_BYTES (1u << 20)
/* What one held frame costs beyond its bytes (its record and the allocator's share). */
#define FRAME_OVERHEAD 64
#define MAX_CONNECTIONS 128
#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define REVIVE_AFTER_MS 1000
#define REVIVE_EVERY_MS 10000
#define GONE_CHECK_MS 1000
#define SAY_EVERY_MS 10000
#define READ_CHUNK 65536

struct frame {
  struct frame *next;
  uint32_t stream_id;
  uint8_t type;
  size_t len; /* header included */
  size_t cap;
  unsigned char bytes[];
};

struct list {
  struct frame *head, *tail;
};

/* A frame being read, byte by byte as it arrives. */
struct reader {
  unsigned char header[HEADER_BYTES];
  size_t header_fill;
  struct frame *frame; /* the frame under way, grown as its data arrives */
  size_t fill;
  uint64_t skip; /* bytes of an oversized frame still to pass by */
  uint32_t skip_id;
  int skipping;
};

enum up_state { UP_DOWN, UP_CONNECTED };

struct conn {
  int down, up;
  enum up_state state;
  long long retry_at_ms, connected_at_ms;
  int backoff_ms;
  int answered_since_connect;
  struct reader from_down, from_up;
  struct list queue;    /* to the upstream, not yet (fully) written; in arrival order */
  size_t queue_off;     /* bytes of queue.head already written */
  struct list sent;     /* requests written, waiting for their answers; in the order sent */
  struct list answers;  /* to the downstream */
  size_t answers_off;
  size_t held;          /* bytes (with overhead) of queue and sent */
  size_t unsent;        /* bytes of queue */
  size_t answer_bytes;  /* bytes of answers */
  unsigned requests;    /* requests in queue and sent */
};

static const char *listen_path, *upstream_path, *pid_file;
static char gone_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
static char **revive_argv;
static struct conn *conns[MAX_CONNECTIONS];
static int nconns;
static size_t total_bytes;
static long long refused_since_ms = -1, last_revive_ms = -1;
static volatile sig_atomic_t terminate;
static unsigned char chunk[READ_CHUNK];
static dev_t listen_dev;
static ino_t listen_ino;

static void die(const char *step, const char *what) {
  fprintf(stderr, "kata-ts-shim-relay: %s%s%s: %s\n", step, what ? " " : "", what ? what : "", strerror(errno));
  exit(FAIL_EXIT);
}

static void usage(const char *why) {
  fprintf(stderr,
          "kata-ts-shim-relay: %s\nusage: kata-ts-shim-relay --listen SOCKET --upstream SOCKET [--pid-file FILE] "
          "[-- REVIVE-PROGRAM [ARG]...]\n",
          why);
  exit(FAIL_EXIT);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_term(int sig) {
  (void)sig;
  terminate = 1;
}

static int fill_addr(struct sockaddr_un *addr, const char *path) {
  size_t len = strlen(path);
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (len == 0 || len >= sizeof addr->sun_path) return -1;
  memcpy(addr->sun_path, path, len + 1);
  return 0;
}

/* ---- frames and their accounting ---- */

static size_t cost(const struct frame *f) { return f->cap + FRAME_OVERHEAD; }

/* A frame of `cap` bytes, or NULL when the process-wide bound would be passed. */
static struct frame *frame_new(size_t cap) {
  if (total_bytes + cap + FRAME_OVERHEAD > MAX_TOTAL_BYTES) return NULL;
  struct frame *f = malloc(sizeof *f + cap);
  if (f == NULL) return NULL;
  memset(f, 0, sizeof *f);
  f->cap = cap;
  total_bytes += cap + FRAME_OVERHEAD;
  return f;
}

static struct frame *frame_grow(struct frame *f, size_t cap) {
  if (total_bytes - f->cap + cap > MAX_TOTAL_BYTES) return NULL;
  struct frame *g = realloc(f, sizeof *g + cap);
  if (g == NULL) return NULL;
  total_bytes = total_bytes - g->cap + cap;
  g->cap = cap;
  return g;
}

static void frame_free(struct frame *f) {
  if (f == NULL) return;
  total_bytes -= cost(f);
  free(f);
}

static void list_push(struct list *l, struct frame *f) {
  f->next = NULL;
  if (l->tail) l->tail->next = f;
  else l->head = f;
  l->tail = f;
}

static struct frame *list_pop(struct list *l) {
  struct frame *f = l->head;
  if (f) {
    l->head = f->next;
    if (l->head == NULL) l->tail = NULL;
    f->next = NULL;
  }
  return f;
}

static void list_free(struct list *l) {
  struct frame *f;
  while ((f = list_pop(l)) != NULL) frame_free(f);
}

static void reader_reset(struct reader *r) {
  frame_free(r->frame);
  memset(r, 0, sizeof *r);
}

enum { READ_MORE = 0, READ_FRAME = 1, READ_SKIPPED = 2, READ_OVERSIZE = -1, READ_NOMEM = -2 };

/*
 * Takes bytes from `*p` (up to `end`) into `r`. Returns READ_FRAME with `*out` set when a frame is
 * complete, READ_MORE when the bytes ran out first, READ_OVERSIZE on a header over the cap when
 * `skip_oversize` is 0 (else the frame's bytes are passed by and READ_SKIPPED says so once they
 * have), READ_NOMEM when the bound on held bytes stops it.
 */
static int reader_take(struct reader *r, const unsigned char **p, const unsigned char *end, int skip_oversize,
                       struct frame **out) {
  while (*p < end || (r->frame != NULL && r->fill == r->frame->len) || (r->skipping && r->skip == 0)) {
    if (r->skipping) {
      size_t n = (size_t)(end - *p);
      if (n > r->skip) n = (size_t)r->skip;
      *p += n;
      r->skip -= n;
      if (r->skip > 0) return READ_MORE;
      r->skipping = 0;
      return READ_SKIPPED;
    }
    if (r->frame == NULL) {
      size_t n = HEADER_BYTES - r->header_fill;
      if (n > (size_t)(end - *p)) n = (size_t)(end - *p);
      memcpy(r->header + r->header_fill, *p, n);
      r->header_fill += n;
      *p += n;
      if (r->header_fill < HEADER_BYTES) return READ_MORE;
      r->header_fill = 0;
      uint32_t data = (uint32_t)r->header[0] << 24 | (uint32_t)r->header[1] << 16 | (uint32_t)r->header[2] << 8 | r->header[3];
      uint32_t id = (uint32_t)r->header[4] << 24 | (uint32_t)r->header[5] << 16 | (uint32_t)r->header[6] << 8 | r->header[7];
      if (data > MAX_DATA_BYTES) {
        if (!skip_oversize) return READ_OVERSIZE;
        r->skipping = 1;
        r->skip = data;
        r->skip_id = id;
        continue;
      }
      /* Room for what is announced grows only as it arrives: a header alone costs a chunk. */
      size_t len = HEADER_BYTES + (size_t)data;
      size_t cap = len < READ_CHUNK ? len : READ_CHUNK;
      r->frame = frame_new(cap);
      if (r->frame == NULL) return READ_NOMEM;
      r->frame->len = len;
      r->frame->stream_id = id;
      r->frame->type = r->header[8];
      memcpy(r->frame->bytes, r->header, HEADER_BYTES);
      r->fill = HEADER_BYTES;
      continue;
    }
    struct frame *f = r->frame;
    if (r->fill == f->len) {
      r->frame = NULL;
      r->fill = 0;
      *out = f;
      return READ_FRAME;
    }
    size_t n = f->len - r->fill;
    if (n > (size_t)(end - *p)) n = (size_t)(end - *p);
    if (r->fill + n > f->cap) {
      size_t cap = f->cap * 2;
      if (cap < r->fill + n) cap = r->fill + n;
      if (cap > f->len) cap = f->len;
      struct frame *g = frame_grow(f, cap);
      if (g == NULL) return READ_NOMEM;
      r->frame = f = g;
    }
    memcpy(f->bytes + r->fill, *p, n);
    r->fill += n;
    *p += n;
  }
  return READ_MORE;
}

/* ---- connections ---- */

static void close_conn(int i, const char *why) {
  struct conn *c = conns[i];
  if (why != NULL) fprintf(stderr, "kata-ts-shim-relay: closing a connection: %s\n", why);
  close(c->down);
  if (c->up >= 0) close(c->up);
  list_free(&c->queue);
  list_free(&c->sent);
  list_free(&c->answers);
  reader_reset(&c->from_down);
  reader_reset(&c->from_up);
  free(c);
  conns[i] = conns[--nconns];
  conns[nconns] = NULL;
}

static unsigned unanswered(void) {
  unsigned n = 0;
  for (int i = 0; i < nconns; i++) n += conns[i]->requests;
  return n;
}

static int gone_now(void) {
  struct stat st;
  return lstat(gone_path, &st) == 0;
}

static void spawn_revive(long long now) {
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "kata-ts-shim-relay: starting the revive command: %s\n", strerror(errno));
    return;
  }
  if (pid == 0) {
    /* Detached: its own session, nothing of ours but stderr; ignored SIGPIPE would survive exec. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    setsid();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
    }
    execvp(revive_argv[0], revive_argv);
    fprintf(stderr, "kata-ts-shim-relay: executing the revive command %s: %s\n", revive_argv[0], strerror(errno));
    _exit(127);
  }
  last_revive_ms = now;
  fprintf(stderr, "kata-ts-shim-relay: upstream %s refused connections for %lld ms; started %s (pid %d)\n", upstream_path,
          now - refused_since_ms, revive_argv[0], (int)pid);
}

/* The upstream refused a connection: perhaps time to start whoever serves it. */
static void note_refused(long long now) {
  if (refused_since_ms < 0) refused_since_ms = now;
  if (revive_argv == NULL || now - refused_since_ms < REVIVE_AFTER_MS) return;
  if (last_revive_ms >= 0 && now - last_revive_ms < REVIVE_EVERY_MS) return;
  if (gone_now()) return; /* shut down for good: nobody is to be revived */
  spawn_revive(now);
}

static void schedule_retry(struct conn *c, long long now) {
  c->state = UP_DOWN;
  c->retry_at_ms = now + c->backoff_ms;
  c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

static void try_connect(struct conn *c, long long now) {
  struct sockaddr_un addr;
  fill_addr(&addr, upstream_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    schedule_retry(c, now);
    return;
  }
  /* A unix socket connects at once or fails at once (EAGAIN: its backlog is full, it is alive). */
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int err = errno;
    close(fd);
    if (err == ECONNREFUSED || err == ENOENT) note_refused(now);
    schedule_retry(c, now);
    return;
  }
  refused_since_ms = -1;
  c->up = fd;
  c->state = UP_CONNECTED;
  c->connected_at_ms = now;
  c->answered_since_connect = 0;
  c->queue_off = 0;
  if (c->requests > 0) fprintf(stderr, "kata-ts-shim-relay: upstream back; sending %u unanswered request(s) again\n", c->requests);
}

/* The upstream connection failed: what was sent and not answered goes first in the queue. */
static int upstream_lost(int i, long long now, const char *why) {
  struct conn *c = conns[i];
  if (c->requests > 0) fprintf(stderr, "kata-ts-shim-relay: upstream connection lost (%s); %u request(s) unanswered\n", why, c->requests);
  close(c->up);
  c->up = -1;
  reader_reset(&c->from_up);
  if (c->sent.head != NULL) {
    c->sent.tail->next = c->queue.head;
    if (c->queue.tail == NULL) c->queue.tail = c->sent.tail;
    c->queue.head = c->sent.head;
    c->sent.head = c->sent.tail = NULL;
  }
  c->queue_off = 0;
  c->unsent = 0;
  for (struct frame *f = c->queue.head; f; f = f->next) c->unsent += f->len;
  /* A connection that lived and answered starts its backoff again; one that dies at once does not. */
  if (c->answered_since_connect || now - c->connected_at_ms >= BACKOFF_MAX_MS) c->backoff_ms = BACKOFF_FIRST_MS;
  schedule_retry(c, now);
  if (gone_now() && unanswered() == 0) return 1;
  return 0;
}

/* A whole frame from the downstream: queue it for the upstream. 0, or -1 to close the connection. */
static int from_downstream(struct conn *c, struct frame *f) {
  if (c->held + cost(f) > MAX_HELD_BYTES) {
    frame_free(f);
    return -1;
  }
  c->held += cost(f);
  c->unsent += f->len;
  if (f->type == TYPE_REQUEST) c->requests++;
  list_push(&c->queue, f);
  return 0;
}

static void forget(struct conn *c, struct frame *f) {
  c->held -= cost(f);
  if (f->type == TYPE_REQUEST) c->requests--;
  frame_free(f);
}

/* The request `id` waiting for an answer, taken out of `sent`; NULL when there is none. */
static struct frame *take_sent(struct conn *c, uint32_t id) {
  struct frame *prev = NULL;
  for (struct frame *f = c->sent.head; f; prev = f, f = f->next) {
    if (f->stream_id != id) continue;
    if (prev) prev->next = f->next;
    else c->sent.head = f->next;
    if (c->sent.tail == f) c->sent.tail = prev;
    f->next = NULL;
    return f;
  }
  return NULL;
}

static void push_answer(struct conn *c, struct frame *f) {
  c->answer_bytes += f->len;
  list_push(&c->answers, f);
}

/* An upstream frame over the cap went by unread: its request gets RESOURCE_EXHAUSTED, as ttrpc's own client would. */
static int answer_oversize(struct conn *c, uint32_t id) {
  struct frame *req = take_sent(c, id);
  if (req == NULL) return 0;
  forget(c, req);
  static const char msg[] = "kata-ts-shim-relay: the upstream's answer exceeds 4194304 bytes";
  size_t mlen = sizeof msg - 1;
  /* Response { status = 1 { code = 1: 8 (RESOURCE_EXHAUSTED); message = 2 } } */
  size_t status_len = 2 + 2 + mlen;
  size_t data = 2 + status_len;
  struct frame *f = frame_new(HEADER_BYTES + data);
  if (f == NULL) return -1;
  unsigned char *b = f->bytes;
  f->len = HEADER_BYTES + data;
  f->stream_id = id;
  f->type = TYPE_RESPONSE;
  b[0] = 0, b[1] = 0, b[2] = (unsigned char)(data >> 8), b[3] = (unsigned char)data;
  b[4] = (unsigned char)(id >> 24), b[5] = (unsigned char)(id >> 16), b[6] = (unsigned char)(id >> 8), b[7] = (unsigned char)id;
  b[8] = TYPE_RESPONSE, b[9] = 0;
  b += HEADER_BYTES;
  *b++ = 0x0a, *b++ = (unsigned char)status_len;
  *b++ = 0x08, *b++ = 8;
  *b++ = 0x12, *b++ = (unsigned char)mlen;
  memcpy(b, msg, mlen);
  push_answer(c, f);
  return 0;
}

/* A whole frame from the upstream. */
static void from_upstream(struct conn *c, struct frame *f) {
  c->answered_since_connect = 1;
  if (f->type == TYPE_RESPONSE) {
    struct frame *req = take_sent(c, f->stream_id);
    if (req == NULL) {
      /* No request of this downstream is waiting for it (nothing containerd could use). */
      frame_free(f);
      return;
    }
    forget(c, req);
  }
  push_answer(c, f);
}

/* Reads what the downstream has. 0, or -1 to close the connection (`*why` says why). */
static int read_downstream(struct conn *c, const char **why) {
  for (;;) {
    ssize_t n = read(c->down, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      *why = NULL;
      return -1;
    }
    if (n == 0) {
      *why = NULL; /* containerd closed it: nothing is left to answer */
      return -1;
    }
    const unsigned char *p = chunk, *end = chunk + n;
    while (p < end) {
      struct frame *f = NULL;
      int r = reader_take(&c->from_down, &p, end, 0, &f);
      if (r == READ_OVERSIZE) {
        *why = "a frame over 4194304 bytes from the downstream";
        return -1;
      }
      if (r == READ_NOMEM) {
        *why = "the relay's memory bound is reached";
        return -1;
      }
      if (r == READ_FRAME && from_downstream(c, f) != 0) {
        *why = "over 16 MiB queued or unanswered for the downstream";
        return -1;
      }
    }
    /* Read no further than the upstream takes, while it is there to take it. */
    if (c->state == UP_CONNECTED && c->unsent >= MAX_UNSENT_BYTES) return 0;
  }
}

/* Reads what the upstream has. 0; 1 when the upstream connection failed; -1 to close the pair. */
static int read_upstream(struct conn *c, const char **why) {
  while (c->answer_bytes < MAX_ANSWER_BYTES) {
    ssize_t n = read(c->up, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      *why = strerror(errno);
      return 1;
    }
    if (n == 0) {
      *why = "closed by the upstream";
      return 1;
    }
    const unsigned char *p = chunk, *end = chunk + n;
    while (p < end) {
      struct frame *f = NULL;
      int r = reader_take(&c->from_up, &p, end, 1, &f);
      if (r == READ_SKIPPED && answer_oversize(c, c->from_up.skip_id) != 0) r = READ_NOMEM;
      if (r == READ_NOMEM) {
        *why = "the relay's memory bound is reached";
        return -1;
      }
      if (r == READ_FRAME) from_upstream(c, f);
    }
  }
  return 0;
}

/* Writes queued frames to the upstream. 0, or 1 when the upstream connection failed. */
static int write_upstream(struct conn *c, const char **why) {
  while (c->queue.head != NULL) {
    struct frame *f = c->queue.head;
    ssize_t n = send(c->up, f->bytes + c->queue_off, f->len - c->queue_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      *why = strerror(errno);
      return 1;
    }
    c->queue_off += (size_t)n;
    c->unsent -= (size_t)n;
    if (c->queue_off < f->len) continue;
    c->queue_off = 0;
    list_pop(&c->queue);
    if (f->type == TYPE_REQUEST) list_push(&c->sent, f);
    else forget(c, f);
  }
  return 0;
}

/* Writes answers to the downstream. 0, or -1 when it is gone. */
static int write_downstream(struct conn *c) {
  while (c->answers.head != NULL) {
    struct frame *f = c->answers.head;
    ssize_t n = send(c->down, f->bytes + c->answers_off, f->len - c->answers_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    c->answers_off += (size_t)n;
    if (c->answers_off < f->len) continue;
    c->answers_off = 0;
    c->answer_bytes -= f->len;
    frame_free(list_pop(&c->answers));
  }
  return 0;
}

/* Until when the listener is not watched: out of descriptors, a pending connection would wake us forever. */
static long long accept_paused_until_ms;

static void accept_one(int listener, long long now) {
  int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_paused_until_ms = now + BACKOFF_FIRST_MS * 2;
    return;
  }
  if (nconns == MAX_CONNECTIONS) {
    /* Said once per 10 s: a flood of connections must not become a flood of log lines. */
    static long long said_ms = -SAY_EVERY_MS;
    if (now - said_ms >= SAY_EVERY_MS) {
      said_ms = now;
      fprintf(stderr, "kata-ts-shim-relay: refusing connections: %d are open already\n", MAX_CONNECTIONS);
    }
    close(fd);
    return;
  }
  struct conn *c = calloc(1, sizeof *c);
  if (c == NULL) {
    close(fd);
    return;
  }
  c->down = fd;
  c->up = -1;
  c->backoff_ms = BACKOFF_FIRST_MS;
  conns[nconns++] = c;
  try_connect(c, now);
}

/* ---- start ---- */

/* The pod's socket: a stale one (nothing answers) is replaced, a live one is not touched. */
static int listen_on(const char *path) {
  struct sockaddr_un addr;
  if (fill_addr(&addr, path) != 0) {
    errno = ENAMETOOLONG;
    die("--listen", path);
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      fprintf(stderr, "kata-ts-shim-relay: --listen %s exists and is not a socket; refusing to replace it\n", path);
      exit(FAIL_EXIT);
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (probe < 0) die("socket", NULL);
    int answered = connect(probe, (struct sockaddr *)&addr, sizeof addr) == 0;
    int err = errno;
    close(probe);
    /* EAGAIN: a listener whose backlog is full, alive. Only a refusal proves nobody listens. */
    if (answered || err == EAGAIN) {
      fprintf(stderr, "kata-ts-shim-relay: --listen %s is a socket something answers on; refusing to replace it\n", path);
      exit(FAIL_EXIT);
    }
    if (err != ECONNREFUSED) {
      errno = err;
      die("probing the existing socket", path);
    }
    if (unlink(path) != 0 && errno != ENOENT) die("removing the stale socket", path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) die("socket", NULL);
  /* 0600 from its first moment: the umask applies to the socket bind creates. */
  mode_t old = umask(0177);
  int bound = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  umask(old);
  if (bound != 0) die("binding", path);
  if (listen(fd, MAX_CONNECTIONS) != 0) die("listening on", path);
  if (stat(path, &st) != 0) die("stat", path);
  listen_dev = st.st_dev;
  listen_ino = st.st_ino;
  return fd;
}

static void write_pid_file(const char *path) {
  char tmp[4096], text[32];
  int len = snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (len < 0 || (size_t)len >= sizeof tmp) {
    errno = ENAMETOOLONG;
    die("--pid-file", path);
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) die("creating", tmp);
  len = snprintf(text, sizeof text, "%d\n", (int)getpid());
  if (write(fd, text, (size_t)len) != len || close(fd) != 0) die("writing", tmp);
  if (rename(tmp, path) != 0) die("renaming the pid file to", path);
}

/* Removes the pod's socket on the way out, if it is still the one this relay made. */
static void unlink_listen(void) {
  struct stat st;
  if (lstat(listen_path, &st) == 0 && st.st_dev == listen_dev && st.st_ino == listen_ino) unlink(listen_path);
}

/*
 * --hold: keeps descriptors 1 and 2 open while they are FIFOs with a reader. A FIFO's write end
 * polls POLLERR once its last reader is gone, which is the end; anything else (/dev/null for a
 * stream the container does not have) is not watched.
 */
static int hold(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (chdir("/") != 0) return FAIL_EXIT;
  struct pollfd fds[2];
  int n = 0;
  for (int fd = 1; fd <= 2; fd++) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) fds[n++] = (struct pollfd){.fd = fd, .events = 0};
  }
  while (!terminate && n > 0) {
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      return FAIL_EXIT;
    }
    int open_left = 0;
    for (int k = 0; k < n; k++) {
      if (fds[k].revents & (POLLERR | POLLHUP | POLLNVAL)) fds[k].fd = -1;
      if (fds[k].fd >= 0) open_left++;
    }
    if (open_left == 0) break;
  }
  return 0;
}

int main(int argc, char **argv) {
  int i;
  if (argc == 3 && strcmp(argv[1], "--hold") == 0) return hold();
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (i + 1 >= argc) usage("an option lacks its value");
    if (strcmp(a, "--listen") == 0) listen_path = argv[++i];
    else if (strcmp(a, "--upstream") == 0) upstream_path = argv[++i];
    else if (strcmp(a, "--pid-file") == 0) pid_file = argv[++i];
    else usage("unknown option");
  }
  if (listen_path == NULL || listen_path[0] != '/') usage("--listen must be an absolute path");
  if (upstream_path == NULL || upstream_path[0] != '/') usage("--upstream must be an absolute path");
  if (pid_file != NULL && pid_file[0] != '/') usage("--pid-file must be an absolute path");
  struct sockaddr_un probe;
  if (fill_addr(&probe, upstream_path) != 0) usage("--upstream is longer than a unix socket path may be");
  snprintf(gone_path, sizeof gone_path, "%s.gone", upstream_path);
  if (i < argc) revive_argv = &argv[i];

  /* Frames past a read chunk live in their own mappings, given back whole when freed: a flood
   * that is refused leaves no grown heap behind (a fixed threshold also stops glibc raising it). */
  mallopt(M_MMAP_THRESHOLD, READ_CHUNK);

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term; /* no SA_RESTART: poll returns at once */
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  /* SIGTERM is let in only while ppoll waits, so one arriving between loops is not slept through. */
  sigset_t term, waiting_mask;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGINT);
  sigprocmask(SIG_BLOCK, &term, &waiting_mask);
  sigdelset(&waiting_mask, SIGTERM);
  sigdelset(&waiting_mask, SIGINT);

  int listener = listen_on(listen_path);
  if (pid_file != NULL) write_pid_file(pid_file);
  /* Every path is absolute: hold no directory of the caller's (a bundle) for the relay's life. */
  if (chdir("/") != 0) die("changing directory to", "/");

  static struct pollfd fds[1 + 2 * MAX_CONNECTIONS];
  static int owner[1 + 2 * MAX_CONNECTIONS];
  long long next_gone_ms = now_ms();
  while (!terminate) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    long long now = now_ms();
    if (now >= next_gone_ms) {
      next_gone_ms = now + GONE_CHECK_MS;
      if (gone_now() && unanswered() == 0) break;
    }
    for (i = 0; i < nconns; i++)
      if (conns[i]->state == UP_DOWN && now >= conns[i]->retry_at_ms) try_connect(conns[i], now);

    long long wake = next_gone_ms;
    int n = 0;
    fds[n] = (struct pollfd){.fd = now < accept_paused_until_ms ? -1 : listener, .events = POLLIN};
    owner[n++] = -1;
    if (now < accept_paused_until_ms && accept_paused_until_ms < wake) wake = accept_paused_until_ms;
    for (i = 0; i < nconns; i++) {
      struct conn *c = conns[i];
      short ev = 0;
      if (c->state == UP_DOWN || c->unsent < MAX_UNSENT_BYTES) ev |= POLLIN;
      if (c->answers.head != NULL) ev |= POLLOUT;
      fds[n] = (struct pollfd){.fd = c->down, .events = ev};
      owner[n++] = i;
      if (c->state == UP_CONNECTED) {
        ev = 0;
        if (c->answer_bytes < MAX_ANSWER_BYTES) ev |= POLLIN;
        if (c->queue.head != NULL) ev |= POLLOUT;
        /* Not watched at all when nothing is wanted of it: poll reports a hang-up regardless, and
         * an upstream gone while a stuck downstream holds us back would spin. */
        fds[n] = (struct pollfd){.fd = ev != 0 ? c->up : -1, .events = ev};
        owner[n++] = i;
      } else if (c->retry_at_ms < wake) {
        wake = c->retry_at_ms;
      }
    }
    long long wait_ms = wake - now;
    if (wait_ms < 0) wait_ms = 0;
    struct timespec ts = {.tv_sec = wait_ms / 1000, .tv_nsec = (wait_ms % 1000) * 1000000};
    if (ppoll(fds, (nfds_t)n, &ts, &waiting_mask) < 0) {
      if (errno == EINTR) continue;
      die("ppoll", NULL);
    }
    now = now_ms();
    /* Walk the connections from the last: closing one moves the last into its slot. */
    int exit_gone = 0;
    for (int k = n - 1; k >= 1; k--) {
      if (fds[k].revents == 0) continue;
      int ci = owner[k];
      if (ci >= nconns) continue;
      struct conn *c = conns[ci];
      const char *why = NULL;
      if (fds[k].fd == c->down) {
        if ((fds[k].revents & POLLOUT) && write_downstream(c) != 0) {
          close_conn(ci, NULL);
          continue;
        }
        if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) && read_downstream(c, &why) != 0) {
          close_conn(ci, why);
          continue;
        }
        /* Frames just queued go out now rather than after another poll. */
        if (c->state == UP_CONNECTED && c->queue.head != NULL && write_upstream(c, &why) != 0) exit_gone |= upstream_lost(ci, now, why);
      } else if (c->state == UP_CONNECTED && c->up >= 0 && fds[k].fd == c->up) {
        int r = 0;
        if (fds[k].revents & POLLOUT) r = write_upstream(c, &why);
        if (r == 0 && (fds[k].revents & (POLLIN | POLLHUP | POLLERR))) r = read_upstream(c, &why);
        if (r < 0) {
          close_conn(ci, why);
          continue;
        }
        if (r > 0) exit_gone |= upstream_lost(ci, now, why);
        else if (c->answers.head != NULL && write_downstream(c) != 0) close_conn(ci, NULL);
      }
    }
    if (exit_gone) break;
    if (fds[0].revents & POLLIN) {
      for (int k = 0; k < 16; k++) {
        int before = nconns;
        accept_one(listener, now);
        if (nconns == before) break;
      }
    }
  }
  while (nconns > 0) close_conn(nconns - 1, NULL);
  close(listener);
  unlink_listen();
  return 0;
}
