/*
 * kata-ts-shim-start: the native front of `containerd-shim-kata-ts-v2 ... start` (docs/shim.md
 * "The start fast path"). containerd runs `start` once for every task, the pod's sandbox and each
 * of its containers; the Node shim answers it in about a quarter of a second on an idle machine
 * (most of it loading modules and compiling the config's schema) and in up to seconds on a loaded
 * one. When the pod's server already answers (every container's start, a sandbox's start repeated
 * by containerd), the answer is only its address, and this program gives it without Node:
 *
 *     kata-ts-shim-start FALLBACK-PROGRAM [ARG]... -- SHIM-ARGS...
 *     containerd-shim-kata-ts-v2 SHIM-ARGS...      (a link to this binary under the shim's name)
 *
 * It reads SHIM-ARGS as src/shim/main.ts does, finds the pod's socket as src/shim/start.ts does
 * (the state root from the kata-ts config, the sandbox id from the bundle's config.json), and
 * when something accepts a connection there it drains stdin as Node would, writes
 * `<bundle>/address` atomically and prints the address, exit 0. In every other case (another
 * action, a flag it does not take, anything unexpected in a file, no server, a config Node has not
 * accepted as it is now) it execs `FALLBACK-PROGRAM [ARG]... SHIM-ARGS...` (the Node shim;
 * FALLBACK-PROGRAM is a path, never looked up in PATH) before
 * it has written or consumed anything, so containerd sees that program's answer instead. Run
 * through a link under the shim's own name (what containerd execs), FALLBACK-PROGRAM is the Node
 * shim of the tree this binary belongs to, `<root>/bin/<that name>`, whose first line runs Node.
 *
 * The config is the one thing it cannot judge: Node validates it against its schema. So the fast
 * path is taken only when `<stateRoot>/start-stamp`, written by a Node `start` that loaded the
 * config successfully, names this binary's own code tree (another release's schema may judge the
 * config otherwise) and this config file with the identity (device, inode, size, mtime, ctime) it
 * has now: any edit changes the ctime and sends the next start through Node again.
 *
 * Everything read (config, bundle, stamp) is untrusted: files are bounded, JSON is validated
 * whole (as JSON.parse would refuse it, or the fast path is not taken), strings needing escapes
 * are not decoded but left to Node.
 * With KATA_TS_SHIM_START_LOG=<absolute path> it appends one line per invocation saying which way
 * it went and why (it never writes to stdout or stderr otherwise: containerd reads them as the address).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_JSON_BYTES (8u << 20)
#define MAX_STAMP_BYTES 16384
#define MAX_DEPTH 256
#define MAX_SOCKET_PATH_BYTES 106
#define IDENTIFIER_MAX_CHARS 76
#define STDIN_MAX_BYTES (1u << 20)
#define STDIN_WAIT_MS 2000
#define DEFAULT_CONFIG_PATH "/etc/kata-ts/config.json"
#define DEFAULT_STATE_ROOT "/run/kata-ts/shim"
#define STAMP_FILE "start-stamp"
#define STAMP_MAGIC "kata-ts shim start stamp 2"
#define SELF_NAME "kata-ts-shim-start"
#define SHIM_NAME "containerd-shim-kata-ts-v2"

static char **fallback_argv;
static const char *log_path;
static const char *task_id = "";

/* ---- the way out ---- */

static void note(const char *way, const char *why) {
  if (log_path == NULL || log_path[0] != '/') return;
  int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  char line[512];
  int n = snprintf(line, sizeof line, "%s %s%s%s\n", way, task_id, why ? ": " : "", why ? why : "");
  if (n > 0) {
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (write(fd, line, (size_t)n) < 0) { /* best effort */
    }
  }
  close(fd);
}

/* Hands the invocation to the Node shim: nothing has been written or read from stdin yet. */
static void fall_back(const char *why) {
  note("fallback", why);
  execv(fallback_argv[0], fallback_argv);
  /* Not even Node can be started: say so the way the shim says a failure (exit 1, one line). */
  fprintf(stderr, "containerd-shim-kata-ts-v2 start: cannot run %s: %s\n", fallback_argv[0], strerror(errno));
  exit(1);
}

/* ---- JSON: validated whole, with the few members the fast path needs picked out ---- */

struct json {
  const unsigned char *p, *end;
  int depth;
};

/* A string's raw bytes between its quotes; `escaped` when it holds a backslash (not decoded here). */
struct span {
  const unsigned char *s;
  size_t len;
  int escaped;
  int set;
};

static void skip_ws(struct json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static int parse_string(struct json *j, struct span *out) {
  if (j->p >= j->end || *j->p != '"') return -1;
  j->p++;
  const unsigned char *start = j->p;
  int escaped = 0;
  while (j->p < j->end) {
    unsigned char c = *j->p;
    if (c == '"') {
      if (out) *out = (struct span){.s = start, .len = (size_t)(j->p - start), .escaped = escaped, .set = 1};
      j->p++;
      return 0;
    }
    if (c < 0x20) return -1;
    if (c == '\\') {
      escaped = 1;
      if (j->end - j->p < 2) return -1;
      unsigned char e = j->p[1];
      if (e == 'u') {
        if (j->end - j->p < 6 || !is_hex(j->p[2]) || !is_hex(j->p[3]) || !is_hex(j->p[4]) || !is_hex(j->p[5])) return -1;
        j->p += 6;
        continue;
      }
      if (strchr("\"\\/bfnrt", e) == NULL || e == 0) return -1;
      j->p += 2;
      continue;
    }
    j->p++;
  }
  return -1;
}

static int digits(struct json *j) {
  const unsigned char *s = j->p;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  return j->p > s ? 0 : -1;
}

static int parse_number(struct json *j) {
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end) return -1;
  if (*j->p == '0') j->p++;
  else if (digits(j) != 0) return -1;
  if (j->p < j->end && *j->p == '.') {
    j->p++;
    if (digits(j) != 0) return -1;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    if (digits(j) != 0) return -1;
  }
  return 0;
}

static int literal(struct json *j, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0) return -1;
  j->p += n;
  return 0;
}

/*
 * Called for each member of an object walked by parse_object: the key's raw span, with the parser
 * at the member's value, which the callback must consume (parse_value, or a nested parse_object).
 */
typedef int (*member_fn)(struct json *j, const struct span *key, void *ctx);

static int parse_value(struct json *j);

static int parse_object(struct json *j, member_fn fn, void *ctx) {
  if (j->p >= j->end || *j->p != '{') return -1;
  if (++j->depth > MAX_DEPTH) return -1;
  j->p++;
  skip_ws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
    j->depth--;
    return 0;
  }
  for (;;) {
    struct span key;
    skip_ws(j);
    if (parse_string(j, &key) != 0) return -1;
    skip_ws(j);
    if (j->p >= j->end || *j->p != ':') return -1;
    j->p++;
    skip_ws(j);
    if ((fn ? fn(j, &key, ctx) : parse_value(j)) != 0) return -1;
    skip_ws(j);
    if (j->p >= j->end) return -1;
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p != '}') return -1;
    j->p++;
    j->depth--;
    return 0;
  }
}

static int parse_array(struct json *j) {
  if (++j->depth > MAX_DEPTH) return -1;
  j->p++; /* '[' */
  skip_ws(j);
  if (j->p < j->end && *j->p == ']') {
    j->p++;
    j->depth--;
    return 0;
  }
  for (;;) {
    skip_ws(j);
    if (parse_value(j) != 0) return -1;
    skip_ws(j);
    if (j->p >= j->end) return -1;
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p != ']') return -1;
    j->p++;
    j->depth--;
    return 0;
  }
}

static int parse_value(struct json *j) {
  if (j->p >= j->end) return -1;
  switch (*j->p) {
  case '{': return parse_object(j, NULL, NULL);
  case '[': return parse_array(j);
  case '"': return parse_string(j, NULL);
  case 't': return literal(j, "true");
  case 'f': return literal(j, "false");
  case 'n': return literal(j, "null");
  default: return parse_number(j);
  }
}

/* The value at the parser: a string's span (`set`), else consumed and left unset. */
static int string_or_other(struct json *j, struct span *out) {
  memset(out, 0, sizeof *out);
  if (j->p < j->end && *j->p == '"') return parse_string(j, out);
  return parse_value(j);
}

static int key_is(const struct span *key, const char *name) { return !key->escaped && key->len == strlen(name) && memcmp(key->s, name, key->len) == 0; }

/* A whole document: one object, nothing but white space around it. */
static int parse_document(const unsigned char *text, size_t len, member_fn fn, void *ctx) {
  struct json j = {.p = text, .end = text + len, .depth = 0};
  skip_ws(&j);
  if (parse_object(&j, fn, ctx) != 0) return -1;
  skip_ws(&j);
  return j.p == j.end ? 0 : -1;
}

/* -- the kata-ts config: shim.stateRoot (the last `shim` wins, as JSON.parse has it) -- */

struct config_pick {
  struct span state_root;
  int unsure; /* a key that may decode to one of ours */
};

static int config_shim_member(struct json *j, const struct span *key, void *ctx) {
  struct config_pick *c = ctx;
  if (key->escaped) c->unsure = 1;
  if (key_is(key, "stateRoot")) return string_or_other(j, &c->state_root);
  return parse_value(j);
}

static int config_member(struct json *j, const struct span *key, void *ctx) {
  struct config_pick *c = ctx;
  if (key->escaped) c->unsure = 1;
  if (!key_is(key, "shim")) return parse_value(j);
  memset(&c->state_root, 0, sizeof c->state_root);
  if (j->p < j->end && *j->p == '{') return parse_object(j, config_shim_member, c);
  c->unsure = 1; /* not an object: Node's schema refuses it */
  return parse_value(j);
}

/* -- the bundle's config.json: the four annotations src/shim/bundle.ts taskRole() reads -- */

enum { CRI_TYPE, CRIO_TYPE, CRI_SANDBOX, CRIO_SANDBOX, ANNOTATIONS };
static const char *const annotation_names[ANNOTATIONS] = {
    "io.kubernetes.cri.container-type",
    "io.kubernetes.cri-o.ContainerType",
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri-o.SandboxID",
};

struct bundle_pick {
  struct span value[ANNOTATIONS];
  int unsure;
};

static int annotation_member(struct json *j, const struct span *key, void *ctx) {
  struct bundle_pick *b = ctx;
  if (key->escaped) b->unsure = 1;
  for (int k = 0; k < ANNOTATIONS; k++)
    if (key_is(key, annotation_names[k])) return string_or_other(j, &b->value[k]);
  return parse_value(j);
}

static int bundle_member(struct json *j, const struct span *key, void *ctx) {
  struct bundle_pick *b = ctx;
  if (key->escaped) b->unsure = 1;
  if (!key_is(key, "annotations")) return parse_value(j);
  memset(b->value, 0, sizeof b->value);
  /* Not an object: no annotations (bundle.ts stringMap). */
  if (j->p < j->end && *j->p == '{') return parse_object(j, annotation_member, b);
  return parse_value(j);
}

/* ---- SHA-256 (FIPS 180-4), for the socket's name ---- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
    0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
    0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
    0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
    0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
    0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const unsigned char *b) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = bb;
    bb = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += bb, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

static void sha256_hex(const unsigned char *msg, size_t len, char out[65]) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t i = 0;
  for (; len - i >= 64; i += 64) sha256_block(h, msg + i);
  unsigned char tail[128] = {0};
  size_t rest = len - i;
  memcpy(tail, msg + i, rest);
  tail[rest] = 0x80;
  size_t blocks = rest + 9 > 64 ? 2 : 1;
  uint64_t bits = (uint64_t)len * 8;
  for (int k = 0; k < 8; k++) tail[blocks * 64 - 1 - k] = (unsigned char)(bits >> (8 * k));
  for (size_t b = 0; b < blocks; b++) sha256_block(h, tail + 64 * b);
  for (int k = 0; k < 8; k++) snprintf(out + 8 * k, 9, "%08x", h[k]);
}

/* ---- checks the Node path makes, or that keep its path arithmetic trivial ---- */

/* containerd's identifiers: letters and digits, separated by single '.', '_' or '-' (src/shim/paths.ts). */
static int is_identifier(const char *s, size_t len) {
  if (len == 0 || len > IDENTIFIER_MAX_CHARS) return 0;
  int after_sep = 1;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) after_sep = 0;
    else if ((c == '.' || c == '_' || c == '-') && !after_sep) after_sep = 1;
    else return 0;
  }
  return !after_sep;
}

/*
 * An absolute path that path.join / path.resolve leave as it is: no empty, "." or ".." segment and
 * no trailing slash. Anything else is left to Node (its normalisation decides what it names).
 */
static int is_plain_absolute(const char *s, size_t len) {
  if (len < 2 || s[0] != '/' || s[len - 1] == '/') return 0;
  if (memchr(s, '\0', len) != NULL) return 0;
  size_t seg = 1;
  for (size_t i = 1; i <= len; i++) {
    if (i == len || s[i] == '/') {
      size_t n = i - seg;
      if (n == 0 || (n == 1 && s[seg] == '.') || (n == 2 && s[seg] == '.' && s[seg + 1] == '.')) return 0;
      seg = i + 1;
    }
  }
  return 1;
}

/* A whole file of at most `max` bytes (NUL-terminated copy), opened without following a last symlink
 * only when `nofollow`; NULL with errno set otherwise. */
static unsigned char *read_file(const char *path, size_t max, int nofollow, size_t *len_out, struct stat *st_out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (size_t)st.st_size > max) {
    close(fd);
    errno = EFBIG;
    return NULL;
  }
  unsigned char *buf = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (buf != NULL && got <= (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size + 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (buf == NULL || got != (size_t)st.st_size) { /* grew or shrank under us: Node may read either */
    free(buf);
    errno = EAGAIN;
    return NULL;
  }
  buf[got] = 0;
  *len_out = got;
  if (st_out) *st_out = st;
  return buf;
}

/* ---- the stamp a Node start left: which config it accepted, as that file was then ---- */

/* The tree this binary belongs to: `<root>` of `<root>/dist/native/kata-ts-shim-start`, links resolved; NULL when it is not there. */
static const char *own_root(void) {
  static char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = 0;
  static const char suffix[] = "/dist/native/" SELF_NAME;
  size_t slen = strlen(suffix);
  if ((size_t)n <= slen || strcmp(exe + n - slen, suffix) != 0) return NULL;
  exe[n - slen] = 0;
  return exe;
}

/*
 * The stamp names the code tree whose Node shim accepted the config (another release's schema may
 * not), the config file as it was then, and the state root it gave.
 */
static int stamp_matches(const char *state_root, const char *config_path, const struct stat *cst) {
  char path[4096], want[12288];
  const char *root = own_root();
  if (root == NULL) return 0;
  if ((size_t)snprintf(path, sizeof path, "%s/%s", state_root, STAMP_FILE) >= sizeof path) return 0;
  size_t len;
  unsigned char *text = read_file(path, MAX_STAMP_BYTES, 1, &len, NULL);
  if (text == NULL) return 0;
  int n;
  if (config_path == NULL)
    n = snprintf(want, sizeof want, "%s\ncode %s\nconfig -\nstateRoot %s\n", STAMP_MAGIC, root, state_root);
  else
    n = snprintf(want, sizeof want, "%s\ncode %s\nconfig %s\nidentity %llu %llu %lld %lld.%09ld %lld.%09ld\nstateRoot %s\n", STAMP_MAGIC,
                 root, config_path, (unsigned long long)cst->st_dev, (unsigned long long)cst->st_ino, (long long)cst->st_size,
                 (long long)cst->st_mtim.tv_sec, cst->st_mtim.tv_nsec, (long long)cst->st_ctim.tv_sec, cst->st_ctim.tv_nsec,
                 state_root);
  int same = n > 0 && (size_t)n < sizeof want && (size_t)n == len && memcmp(text, want, len) == 0;
  free(text);
  return same;
}

/* ---- the answer ---- */

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* As main.ts drainStdin: runtime options, read up to 1 MiB for at most 2 s and dropped; a TTY is not read. */
static void drain_stdin(void) {
  if (isatty(0)) return;
  static unsigned char buf[65536];
  size_t total = 0;
  long long deadline = now_ms() + STDIN_WAIT_MS;
  for (;;) {
    long long left = deadline - now_ms();
    if (left <= 0) return;
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    int r = poll(&pfd, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    ssize_t n = read(0, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    total += (size_t)n;
    if (total >= STDIN_MAX_BYTES) return;
  }
}

/* True when something accepts a connection on the unix socket now (a refusal, or a full backlog, is not). */
static int socket_answers(const char *path) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr.sun_path) return 0;
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;
  int ok = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
  close(fd);
  return ok;
}

/* `<bundle>/address`, as src/common/fsutil.ts writeFileAtomic writes it: a temporary file, fsync, rename, fsync of the dir. */
static int write_address_file(const char *bundle, const char *address) {
  unsigned char rnd[6];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) return -1;
  char tmp[4096], file[4096];
  if ((size_t)snprintf(file, sizeof file, "%s/address", bundle) >= sizeof file) return -1;
  if ((size_t)snprintf(tmp, sizeof tmp, "%s/.address.%02x%02x%02x%02x%02x%02x.tmp", bundle, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
                       rnd[5]) >= sizeof tmp)
    return -1;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  size_t len = strlen(address);
  int ok = write(fd, address, len) == (ssize_t)len && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, file) != 0) {
    unlink(tmp);
    return -1;
  }
  int dir = open(bundle, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return 0;
}

/* ---- the command line, read as main.ts parseShimArgs reads it (Go's flag package) ---- */

struct args {
  const char *namespace, *address, *publish_binary, *id, *bundle, *socket;
  int debug;
  const char *action;
};

static int is_true(const char *v) {
  return !strcmp(v, "1") || !strcmp(v, "t") || !strcmp(v, "T") || !strcmp(v, "TRUE") || !strcmp(v, "true") || !strcmp(v, "True");
}
static int is_false(const char *v) {
  return !strcmp(v, "0") || !strcmp(v, "f") || !strcmp(v, "F") || !strcmp(v, "FALSE") || !strcmp(v, "false") || !strcmp(v, "False");
}

/* 0 when parsed; else why the fast path is not for this command line. */
static const char *parse_args(int argc, char **argv, struct args *a) {
  static const char *const strings[] = {"namespace", "address", "publish-binary", "id", "bundle", "socket", "debug-socket"};
  const char **slots[] = {&a->namespace, &a->address, &a->publish_binary, &a->id, &a->bundle, &a->socket, NULL};
  int i = 0;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strlen(arg) < 2 || arg[0] != '-') break;
    if (!strcmp(arg, "--")) {
      i++;
      break;
    }
    const char *body = arg[1] == '-' ? arg + 2 : arg + 1;
    if (body[0] == 0 || body[0] == '-' || body[0] == '=') return "bad flag syntax";
    const char *eq = strchr(body, '=');
    size_t nlen = eq ? (size_t)(eq - body) : strlen(body);
    int matched = 0;
    if (nlen == 5 && !strncmp(body, "debug", 5)) {
      if (eq == NULL || is_true(eq + 1)) a->debug = 1;
      else if (is_false(eq + 1)) a->debug = 0;
      else return "a bad boolean";
      continue;
    }
    for (size_t k = 0; k < sizeof strings / sizeof strings[0]; k++) {
      if (nlen != strlen(strings[k]) || strncmp(body, strings[k], nlen) != 0) continue;
      const char *value;
      if (eq) value = eq + 1;
      else if (i + 1 < argc) value = argv[++i];
      else return "a flag without its value";
      if (slots[k]) *slots[k] = value;
      matched = 1;
      break;
    }
    /* -v, -info, -h and anything unknown: Node's to answer. */
    if (!matched) return "a flag the fast path leaves to Node";
  }
  a->action = i < argc ? argv[i] : "";
  return NULL;
}

/*
 * Run under another name (a link named containerd-shim-kata-ts-v2 to this binary): the fallback is
 * the Node shim of the same tree, `<root>/bin/<that name>` (else `<root>/bin/containerd-shim-kata-ts-v2`),
 * where this binary is `<root>/dist/native/kata-ts-shim-start` (links resolved: the tree it belongs to).
 */
static char *own_shim(const char *name) {
  static char path[4096 + 300];
  const char *root = own_root();
  if (root == NULL) return NULL;
  if (strchr(name, '/') == NULL && strlen(name) < 256) {
    snprintf(path, sizeof path, "%s/bin/%s", root, name);
    if (access(path, X_OK) == 0) return path;
  }
  snprintf(path, sizeof path, "%s/bin/%s", root, SHIM_NAME);
  return path;
}

int main(int argc, char **argv) {
  log_path = getenv("KATA_TS_SHIM_START_LOG");
  const char *self = argc > 0 ? strrchr(argv[0], '/') : NULL;
  self = self ? self + 1 : argc > 0 ? argv[0] : "";
  int sep;
  fallback_argv = malloc(sizeof(char *) * ((size_t)argc + 1));
  if (fallback_argv == NULL) return 1;
  int n = 0;
  if (strcmp(self, SELF_NAME) == 0) {
    sep = 1;
    while (sep < argc && strcmp(argv[sep], "--") != 0) sep++;
    if (sep == 1 || sep >= argc) {
      fprintf(stderr, "usage: " SELF_NAME " FALLBACK-PROGRAM [ARG]... -- SHIM-ARGS...\n   or, as a link named " SHIM_NAME ": SHIM-ARGS...\n");
      return 2;
    }
    /* The fallback: FALLBACK-PROGRAM [ARG]... SHIM-ARGS... (over the "--"). */
    for (int k = 1; k < sep; k++) fallback_argv[n++] = argv[k];
  } else {
    sep = 0;
    char *shim = own_shim(self);
    if (shim == NULL) {
      fprintf(stderr, "%s: cannot find the Node shim beside %s\n", self, SELF_NAME);
      return 1;
    }
    fallback_argv[n++] = shim;
  }
  for (int k = sep + 1; k < argc; k++) fallback_argv[n++] = argv[k];
  fallback_argv[n] = NULL;

  struct args a = {.namespace = "", .address = "", .publish_binary = "", .id = "", .bundle = "", .socket = "", .action = ""};
  const char *why = parse_args(argc - sep - 1, argv + sep + 1, &a);
  if (why) fall_back(why);
  task_id = a.id;
  if (strcmp(a.action, "start") != 0) fall_back("not a start");
  const char *env_ns = getenv("NAMESPACE"), *env_grpc = getenv("GRPC_ADDRESS");
  const char *ns = a.namespace[0] ? a.namespace : env_ns ? env_ns : "";
  const char *address = a.address[0] ? a.address : env_grpc ? env_grpc : "";
  if (!is_identifier(ns, strlen(ns))) fall_back("the namespace is not plain");
  if (!is_identifier(a.id, strlen(a.id))) fall_back("the id is not plain");
  if (a.socket[0] != 0 && a.socket[0] != '/') fall_back("-socket is relative");
  if (!is_plain_absolute(address, strlen(address))) fall_back("containerd's address is not a plain absolute path");
  char cwd[4096];
  const char *bundle = a.bundle;
  if (bundle[0] == 0) {
    if (getcwd(cwd, sizeof cwd) == NULL) fall_back("no working directory");
    bundle = cwd;
  }
  if (!is_plain_absolute(bundle, strlen(bundle))) fall_back("the bundle is not a plain absolute path");

  /* The config: KATA_TS_CONFIG, else the default file when it exists, else the built-in defaults. */
  const char *config_env = getenv("KATA_TS_CONFIG");
  int config_named = config_env != NULL && config_env[0] != 0;
  const char *config_path = config_named ? config_env : DEFAULT_CONFIG_PATH;
  size_t len;
  struct stat cst;
  unsigned char *text = read_file(config_path, MAX_JSON_BYTES, 0, &len, &cst);
  char state_root[4096];
  if (text == NULL) {
    if (errno != ENOENT || config_named) fall_back("the config cannot be read");
    config_path = NULL;
    strcpy(state_root, DEFAULT_STATE_ROOT);
  } else {
    struct config_pick c;
    memset(&c, 0, sizeof c);
    if (parse_document(text, len, config_member, &c) != 0) fall_back("the config is not a JSON object");
    if (c.unsure) fall_back("the config has escaped keys or an odd shim entry");
    if (!c.state_root.set) strcpy(state_root, DEFAULT_STATE_ROOT);
    else if (c.state_root.escaped || c.state_root.len >= sizeof state_root) fall_back("shim.stateRoot is not plain");
    else {
      memcpy(state_root, c.state_root.s, c.state_root.len);
      state_root[c.state_root.len] = 0;
    }
    free(text);
  }
  if (!is_plain_absolute(state_root, strlen(state_root))) fall_back("shim.stateRoot is not a plain absolute path");
  if (!stamp_matches(state_root, config_path, &cst)) fall_back("no stamp of a Node start for the config as it is now");

  /* The task's role (bundle.ts readBundleConfig and taskRole). */
  char file[4096];
  if ((size_t)snprintf(file, sizeof file, "%s/config.json", bundle) >= sizeof file) fall_back("the bundle's path is too long");
  text = read_file(file, MAX_JSON_BYTES, 0, &len, NULL);
  if (text == NULL) fall_back("the bundle's config.json cannot be read");
  struct bundle_pick b;
  memset(&b, 0, sizeof b);
  if (parse_document(text, len, bundle_member, &b) != 0) fall_back("the bundle's config.json is not a JSON object");
  if (b.unsure) fall_back("the bundle's config.json has escaped keys");
  const struct span *type = b.value[CRI_TYPE].set ? &b.value[CRI_TYPE] : b.value[CRIO_TYPE].set ? &b.value[CRIO_TYPE] : NULL;
  const struct span *sid = b.value[CRI_SANDBOX].set ? &b.value[CRI_SANDBOX] : b.value[CRIO_SANDBOX].set ? &b.value[CRIO_SANDBOX] : NULL;
  if ((type && type->escaped) || (sid && sid->escaped)) fall_back("an annotation is escaped");
  char sandbox[IDENTIFIER_MAX_CHARS + 1];
  int is_sandbox = (type && type->len == 7 && !memcmp(type->s, "sandbox", 7)) ||
                   (type == NULL && (sid == NULL || (sid->len == strlen(a.id) && !memcmp(sid->s, a.id, sid->len))));
  if (is_sandbox) strcpy(sandbox, a.id);
  else {
    if (sid == NULL || !is_identifier((const char *)sid->s, sid->len)) fall_back("the sandbox id is missing or not plain");
    memcpy(sandbox, sid->s, sid->len);
    sandbox[sid->len] = 0;
  }
  free(text);

  /* The pod's socket (paths.ts shimSocketPath): sha256 of "<address>/<namespace>/<sandbox id>". */
  char joined[8192], digest[65], socket_path[4096 + 80];
  int jn = snprintf(joined, sizeof joined, "%s/%s/%s", address, ns, sandbox);
  if (jn < 0 || (size_t)jn >= sizeof joined) fall_back("containerd's address is too long");
  sha256_hex((const unsigned char *)joined, (size_t)jn, digest);
  int sn = snprintf(socket_path, sizeof socket_path, "%s/s/%s", state_root, digest);
  if (sn < 0 || sn > MAX_SOCKET_PATH_BYTES) fall_back("the socket path is too long");
  if (!socket_answers(socket_path)) fall_back("the pod's socket does not answer");

  /* The pod is served: answer as the Node start would. */
  drain_stdin();
  char answer[4096 + 96];
  snprintf(answer, sizeof answer, "unix://%s", socket_path);
  if (write_address_file(bundle, answer) != 0) fall_back("the address file cannot be written");
  note("fast", NULL);
  size_t alen = strlen(answer), off = 0;
  while (off < alen) {
    ssize_t w = write(1, answer + off, alen - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fprintf(stderr, "containerd-shim-kata-ts-v2 start: writing the address: %s\n", strerror(errno));
      return 1;
    }
    off += (size_t)w;
  }
  return 0;
}
