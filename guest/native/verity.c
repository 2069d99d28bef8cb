/*
 * kata-ts-verity: opens a read-only dm-verity device over a disk whose hash tree follows its data
 * (scripts/build-guest.sh writes guest.img that way), for guest/init, which mounts the verified
 * device at /usr instead of the raw disk. busybox has no dmsetup, so this talks to the kernel's
 * device-mapper directly through the ioctls on /dev/mapper/control:
 *
 *   kata-ts-verity NAME DEVICE ROOT_HASH SALT DATA_BLOCKS HASH_START_BLOCK
 *
 * NAME: the mapping's name ([a-z0-9-], at most 64); DEVICE: the block device holding the data and,
 * from HASH_START_BLOCK on, the tree; ROOT_HASH: 64 hex digits (sha256); SALT: hex; DATA_BLOCKS and
 * HASH_START_BLOCK: in 4096-byte blocks. The table is dm-verity format version 1 (salt first),
 * sha256, 4096-byte data and hash blocks, and `restart_on_corruption`: a block whose hash does not
 * lead to the root hash is never returned; the kernel logs it and restarts the VM, which QEMU
 * (-no-reboot) turns into its exit. A guest whose image the host changed stops at once instead of
 * running on with an agent that fails to read its own code.
 *
 * On success it prints /dev/mapper/NAME (a node it makes from the device number the kernel gave;
 * there is no udev) and exits 0. On any failure it removes what it made, says why on stderr and
 * exits 1 (2 for bad arguments). Every argument is checked before it goes into the table line,
 * although they come from the measured kernel command line.
 *
 * Built with gcc -static -Os by scripts/build-guest.sh into the initramfs: it runs before /usr.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/dm-ioctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define CONTROL "/dev/mapper/control"
#define BLOCK_BYTES 4096ULL
#define SECTORS_PER_BLOCK (BLOCK_BYTES / 512)
#define MAX_SALT_HEX 512

/* One dm_ioctl with room for a target spec and its parameter line after it. */
struct dm_request {
	struct dm_ioctl io;
	struct dm_target_spec spec;
	char params[1024];
};

static void die_usage(const char *what)
{
	fprintf(stderr, "kata-ts-verity: %s\n", what);
	fprintf(stderr, "usage: kata-ts-verity NAME DEVICE ROOT_HASH SALT DATA_BLOCKS HASH_START_BLOCK\n");
	exit(2);
}

static int all_of(const char *s, const char *allowed, size_t min, size_t max)
{
	size_t n = strlen(s);
	if (n < min || n > max)
		return 0;
	return strspn(s, allowed) == n;
}

/* A decimal block count, 1 .. 2^40 (4 PiB of 4 KiB blocks: far beyond any guest image). */
static unsigned long long parse_blocks(const char *s, const char *field)
{
	if (!all_of(s, "0123456789", 1, 13) || s[0] == '0')
		die_usage(field);
	unsigned long long v = strtoull(s, NULL, 10);
	if (v == 0 || v > (1ULL << 40))
		die_usage(field);
	return v;
}

static void init_io(struct dm_ioctl *io, size_t size, const char *name)
{
	memset(io, 0, size);
	io->version[0] = DM_VERSION_MAJOR;
	io->version[1] = 0;
	io->version[2] = 0;
	io->data_size = (uint32_t)size;
	io->data_start = sizeof(struct dm_ioctl);
	snprintf(io->name, sizeof io->name, "%s", name);
}

static void remove_device(int control, const char *name)
{
	struct dm_ioctl io;
	init_io(&io, sizeof io, name);
	if (ioctl(control, DM_DEV_REMOVE, &io) != 0)
		fprintf(stderr, "kata-ts-verity: DM_DEV_REMOVE %s: %s\n", name, strerror(errno));
}

int main(int argc, char **argv)
{
	if (argc != 7)
		die_usage("six arguments are needed");
	const char *name = argv[1], *device = argv[2], *root = argv[3], *salt = argv[4];
	if (!all_of(name, "abcdefghijklmnopqrstuvwxyz0123456789-", 1, 64))
		die_usage("NAME must be 1-64 of [a-z0-9-]");
	if (!all_of(root, "0123456789abcdef", 64, 64))
		die_usage("ROOT_HASH must be 64 lowercase hex digits");
	if (!all_of(salt, "0123456789abcdef", 2, MAX_SALT_HEX) || strlen(salt) % 2 != 0)
		die_usage("SALT must be 1-256 bytes of lowercase hex");
	unsigned long long data_blocks = parse_blocks(argv[5], "DATA_BLOCKS must be a positive decimal number");
	unsigned long long hash_start = parse_blocks(argv[6], "HASH_START_BLOCK must be a positive decimal number");
	if (hash_start < data_blocks)
		die_usage("HASH_START_BLOCK must not be below DATA_BLOCKS");

	struct stat st;
	if (stat(device, &st) != 0 || !S_ISBLK(st.st_mode)) {
		fprintf(stderr, "kata-ts-verity: %s is not a block device\n", device);
		return 1;
	}
	unsigned int major_nr = major(st.st_rdev), minor_nr = minor(st.st_rdev);

	int control = open(CONTROL, O_RDWR | O_CLOEXEC);
	if (control < 0) {
		fprintf(stderr, "kata-ts-verity: open %s: %s (is dm-mod loaded?)\n", CONTROL, strerror(errno));
		return 1;
	}

	struct dm_ioctl created;
	init_io(&created, sizeof created, name);
	if (ioctl(control, DM_DEV_CREATE, &created) != 0) {
		fprintf(stderr, "kata-ts-verity: DM_DEV_CREATE %s: %s\n", name, strerror(errno));
		return 1;
	}

	/* The table: the whole data area, target "verity", data and hash on the same device. */
	static struct dm_request req;
	init_io(&req.io, sizeof req, name);
	req.io.target_count = 1;
	req.io.flags = DM_READONLY_FLAG;
	req.spec.sector_start = 0;
	req.spec.length = data_blocks * SECTORS_PER_BLOCK;
	req.spec.next = 0;
	snprintf(req.spec.target_type, sizeof req.spec.target_type, "verity");
	int n = snprintf(req.params, sizeof req.params, "1 %u:%u %u:%u %llu %llu %llu %llu sha256 %s %s 1 restart_on_corruption", major_nr, minor_nr,
			 major_nr, minor_nr, BLOCK_BYTES, BLOCK_BYTES, data_blocks, hash_start, root, salt);
	if (n < 0 || (size_t)n >= sizeof req.params) {
		fprintf(stderr, "kata-ts-verity: the table line does not fit\n");
		remove_device(control, name);
		return 1;
	}
	if (ioctl(control, DM_TABLE_LOAD, &req) != 0) {
		fprintf(stderr, "kata-ts-verity: DM_TABLE_LOAD verity on %s: %s (see the kernel log)\n", device, strerror(errno));
		remove_device(control, name);
		return 1;
	}

	/* DM_DEV_SUSPEND without DM_SUSPEND_FLAG resumes: the loaded table becomes the live one. */
	struct dm_ioctl resume;
	init_io(&resume, sizeof resume, name);
	if (ioctl(control, DM_DEV_SUSPEND, &resume) != 0) {
		fprintf(stderr, "kata-ts-verity: resuming %s: %s\n", name, strerror(errno));
		remove_device(control, name);
		return 1;
	}

	/* No udev: make /dev/mapper/NAME from the device number DM_DEV_CREATE answered. */
	char node[sizeof CONTROL + 70];
	snprintf(node, sizeof node, "/dev/mapper/%s", name);
	dev_t dev = (dev_t)created.dev;
	if (mknod(node, S_IFBLK | 0400, dev) != 0 && errno != EEXIST) {
		fprintf(stderr, "kata-ts-verity: mknod %s: %s\n", node, strerror(errno));
		remove_device(control, name);
		return 1;
	}
	close(control);
	printf("%s\n", node);
	return 0;
}
