/*
 * kata-ts-reseed SECONDS NANOS: after a VM was restored from a template (docs/templates.md),
 * give the guest kernel fresh randomness and the host's wall clock.
 *
 * Reads 32 to 512 bytes of host entropy from stdin, credits them to the kernel's input pool
 * (RNDADDENTROPY: a write to /dev/urandom would mix them in without credit and without making
 * the CRNG draw from the pool again), then forces the CRNG to reseed from that pool at once
 * (RNDRESEEDCRNG): every clone of one template starts with the same CRNG key, and until it
 * reseeds, every clone hands out the same "random" bytes. Then sets CLOCK_REALTIME to
 * SECONDS.NANOS (the host's clock when it sent the request).
 *
 * Prints the wall clock read before it was set, "SECONDS NANOS", on stdout. Any failure exits
 * non-zero with the failing step on stderr; nothing is half done in a way that matters (the
 * entropy credited stays credited, which only helps).
 *
 * Node has no ioctl nor clock_settime, hence this helper. Built static (gcc -static -Os) by
 * scripts/build-guest.sh into /usr/lib/kata-ts/kata-ts-reseed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define ENTROPY_MIN_BYTES 32
#define ENTROPY_MAX_BYTES 512

static int fail(const char *what) {
	fprintf(stderr, "kata-ts-reseed: %s: %s\n", what, strerror(errno));
	return 1;
}

static int parse_long(const char *s, long long min, long long max, long long *out) {
	char *end = NULL;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max) return -1;
	*out = v;
	return 0;
}

int main(int argc, char **argv) {
	long long seconds, nanos;
	if (argc != 3 || parse_long(argv[1], 1, 1LL << 40, &seconds) != 0 || parse_long(argv[2], 0, 999999999, &nanos) != 0) {
		fprintf(stderr, "usage: kata-ts-reseed SECONDS NANOS < entropy\n");
		return 2;
	}
	/* The pool info header and the bytes after it, in one buffer as the ioctl wants them. */
	static unsigned char buf[sizeof(struct rand_pool_info) + ENTROPY_MAX_BYTES + 1];
	struct rand_pool_info *info = (struct rand_pool_info *)buf;
	unsigned char *data = (unsigned char *)info->buf;
	size_t have = 0;
	for (;;) {
		ssize_t n = read(0, data + have, ENTROPY_MAX_BYTES + 1 - have);
		if (n < 0 && errno == EINTR) continue;
		if (n < 0) return fail("read stdin");
		if (n == 0) break;
		have += (size_t)n;
		if (have > ENTROPY_MAX_BYTES) break;
	}
	if (have < ENTROPY_MIN_BYTES || have > ENTROPY_MAX_BYTES) {
		fprintf(stderr, "kata-ts-reseed: stdin held %zu bytes; %d to %d wanted\n", have, ENTROPY_MIN_BYTES, ENTROPY_MAX_BYTES);
		return 2;
	}
	info->buf_size = (int)have;
	info->entropy_count = (int)(have * 8);
	int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
	if (fd < 0) return fail("open /dev/urandom");
	if (ioctl(fd, RNDADDENTROPY, info) != 0) return fail("RNDADDENTROPY");
	if (ioctl(fd, RNDRESEEDCRNG) != 0) return fail("RNDRESEEDCRNG");
	close(fd);
	memset(buf, 0, sizeof buf);

	struct timespec before, now = {.tv_sec = (time_t)seconds, .tv_nsec = (long)nanos};
	if (clock_gettime(CLOCK_REALTIME, &before) != 0) return fail("clock_gettime");
	if (clock_settime(CLOCK_REALTIME, &now) != 0) return fail("clock_settime");
	printf("%lld %ld\n", (long long)before.tv_sec, before.tv_nsec);
	return 0;
}
