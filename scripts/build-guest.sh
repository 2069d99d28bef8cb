#!/usr/bin/env bash
# Build the kata-ts guest: the Debian kernel (extracted from its .deb, never installed on the host),
# a small initramfs (busybox-static, the kernel modules in guest/modules.list with their
# dependencies, guest/init) and a read-only erofs image mounted at /usr in the guest (the host's
# node with its libraries, Debian's crun with its libraries, the agent bundle), followed in the
# same file by its dm-verity hash tree, whose root hash and salt go to guest.img.verity.json (a TEE
# pod's measured command line carries them; guest/init then mounts /usr only through dm-verity).
#
#   scripts/build-guest.sh [--out DIR] [--cache DIR] [--agent-entry FILE] [--agent-snapshot on|off]
#                          [--layout L] [--force]
#
#   --out DIR           where vmlinuz, initramfs.cpio.gz and guest.img go
#                       (default /usr/local/share/kata-ts/guest)
#   --cache DIR         downloaded and extracted kernel packages (default /var/cache/kata-ts/guest-build)
#   --agent-entry FILE  the agent's entry point (default guest/agent/main.ts), bundled by
#                       scripts/build-agent.mjs; tests and benches pass a stub
#   --agent-snapshot S  on (default for the real agent): a V8 start-up snapshot of the agent
#                       (agent.blob) that init starts from, built inside the new guest under QEMU's
#                       TCG (a blob built on the host does not load on a vCPU whose features differ,
#                       and V8 counts CET, which no flag turns off); off: node runs agent.mjs. A stub
#                       entry never gets one; neither does the initramfs layout
#   --layout L          image (default): /usr is the erofs image on a virtio-blk disk;
#                       initramfs: the same files inside the initramfs, no image (what
#                       bench/guest-boot.ts compares against)
#   --force             rebuild even when the inputs have not changed
#
# Needs: apt-get, apt-cache, dpkg-deb, depmod and modprobe (kmod), cpio, gzip, busybox-static,
# mkfs.erofs (erofs-utils), strip (binutils), gcc and libc6-dev (static helpers), crun, node and the
# repository's npm packages (esbuild bundles the agent, tsx runs scripts/guest-verity.ts). Idempotent: when the kernel package,
# busybox, node, crun and their libraries, the agent bundle, guest/ and this script are
# unchanged, it only says so. Every failure stops the script with a message naming what failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=/usr/local/share/kata-ts/guest
cache=/var/cache/kata-ts/guest-build
force=0
agent_entry=$repo/guest/agent/main.ts
agent_entry_given=0
agent_snapshot=on
layout=image

say() { echo "build-guest: $*" >&2; }
die() {
	echo "build-guest: ERROR: $*" >&2
	exit 1
}

while [ $# -gt 0 ]; do
	case "$1" in
	--out) out=${2:?--out needs a directory}; shift 2 ;;
	--cache) cache=${2:?--cache needs a directory}; shift 2 ;;
	--agent-entry) agent_entry=${2:?--agent-entry needs a file}; agent_entry_given=1; shift 2 ;;
	--agent-snapshot) agent_snapshot=${2:?--agent-snapshot needs on or off}; shift 2 ;;
	--layout) layout=${2:?--layout needs image or initramfs}; shift 2 ;;
	--force) force=1; shift ;;
	-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

case "$layout" in image | initramfs) ;; *) die "--layout must be image or initramfs, not $layout" ;; esac
case "$agent_snapshot" in on | off) ;; *) die "--agent-snapshot must be on or off, not $agent_snapshot" ;; esac
# Absolute from here on: paths are compared with what modprobe prints and used after cd.
mkdir -p "$out" "$cache" || die "cannot create $out or $cache"
out=$(cd "$out" && pwd)
cache=$(cd "$cache" && pwd)
# One build at a time per cache: integration test files run in parallel and may ask for the same
# guest at once; the outputs' temporary names and the cached packages are shared, so a second
# build waits here, then finds the guest up to date.
exec 9>"$cache/.build.lock"
flock 9 || die "cannot lock $cache/.build.lock"
agent_entry=$(realpath -m "$agent_entry")
for tool in apt-get apt-cache dpkg-deb depmod modprobe cpio gzip sha256sum mkfs.erofs strip ldd node crun gcc; do
	command -v "$tool" >/dev/null || die "$tool is not installed"
done
busybox=/bin/busybox
[ -x "$busybox" ] || die "$busybox is missing: install busybox-static"
# A dynamically linked busybox would need its libraries in the initramfs.
if LC_ALL=C dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then :; else
	die "busybox-static is not installed (the initramfs needs a static busybox)"
fi

guest_src=$repo/guest
[ -f "$guest_src/init" ] || die "$guest_src/init is missing"
[ -f "$guest_src/modules.list" ] || die "$guest_src/modules.list is missing"
[ -f "$guest_src/modules-verity.list" ] || die "$guest_src/modules-verity.list is missing"
[ -f "$guest_src/native/verity.c" ] || die "$guest_src/native/verity.c is missing"
[ -d "$repo/node_modules/tsx" ] || die "$repo/node_modules/tsx is missing: run npm ci (scripts/setup.sh does)"

# --- 1. which kernel ----------------------------------------------------------------------------
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-amd64$/ { print $2; exit }')
[ -n "$pkg" ] || die "cannot resolve the package linux-image-amd64 depends on (run apt-get update?)"
version=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '$1 == "Version:" { print $2; exit }')
[ -n "$version" ] || die "apt-cache knows no version of $pkg"
kver=${pkg#linux-image-}
say "guest kernel: $pkg $version"

# Scratch trees, removed on exit: the guest's /usr, the initramfs, the unpacked kernel package.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kata-ts-guest.XXXXXX")
root=
trap 'rm -rf "$scratch" ${root:+"$root"}' EXIT
usr=$scratch/usr
stage=$scratch/initramfs

# --- 2. the guest's /usr: node, crun, their libraries, the agent bundle ----------------------------
# The host's node runs the agent: the agent is built and tested against it (Node >= 20, as the
# daemon), and it needs only glibc and libstdc++, where Debian's nodejs (v18) brings a dozen
# shared libraries. Stripped: the debug sections are never loaded, but they would cost space.
node_bin=$(readlink -f "$(command -v node)")
crun_bin=$(readlink -f "$(command -v crun)")
mkdir -p "$usr/bin" "$usr/lib/x86_64-linux-gnu" "$usr/lib64" "$usr/lib/kata-ts"
strip -o "$usr/bin/node" "$node_bin" || die "strip $node_bin failed"
cp "$crun_bin" "$usr/bin/crun"
# What ldd resolves on the host is what the binaries get in the guest, under the same names; the
# ELF interpreter (/lib64/ld-linux-x86-64.so.2) through the /lib64 -> usr/lib64 link of the initramfs.
for elf in "$node_bin" "$crun_bin"; do
	ldd "$elf" | awk '/not found/ { print "MISSING", $1; next } $2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }'
done | LC_ALL=C sort -u | while read -r lib missing; do
	[ "$lib" = MISSING ] && die "a library of node or crun is missing on this host: $missing"
	case "$lib" in
	/lib64/*) cp -L "$lib" "$usr/lib64/$(basename "$lib")" ;;
	*) cp -L "$lib" "$usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
	esac
done
# The agent's static C helpers (no libraries in the guest for them): the reaper that parents
# every container process (guest/agent/containers/native/reaper.c) and the pod's namespace
# holder (guest/native/pause.c). -static -Os: one small file each, runnable before /usr is mounted.
for helper in "kata-ts-reaper:$repo/guest/agent/containers/native/reaper.c" "kata-ts-pause:$guest_src/native/pause.c" "kata-ts-reseed:$guest_src/native/reseed.c"; do
	name=${helper%%:*}
	src=${helper#*:}
	[ -f "$src" ] || die "$src is missing"
	gcc -static -Os -Wall -o "$usr/lib/kata-ts/$name" "$src" || die "gcc -static $src failed (install gcc and libc6-dev)"
	strip "$usr/lib/kata-ts/$name" || die "strip $name failed"
done
# The root of the warm-up container a pre-booted VM runs before it waits for a pod
# (src/runtime/pool/warm.ts): the static busybox, and the mount points a read-only root needs.
warm_root="$usr/lib/kata-ts/warm-rootfs"
rm -rf "$warm_root"
mkdir -p "$warm_root/bin" "$warm_root/proc" "$warm_root/dev" "$warm_root/sys" "$warm_root/tmp"
cp "$busybox" "$warm_root/bin/busybox"
ln -s busybox "$warm_root/bin/sh"
ln -s busybox "$warm_root/bin/sleep"
if [ -f "$agent_entry" ]; then
	say "bundling the agent from ${agent_entry#"$repo"/}"
	# agent.flags: the V8 flags init starts node with (the agent's heap bounds). The snapshot is
	# built by the guest's own node binary with those flags: it loads into nothing else.
	# The snapshot's entry script goes into the image; the blob is built from it in the guest below.
	snapshot_args=()
	if [ "$agent_snapshot" = on ] && [ "$agent_entry" = "$repo/guest/agent/main.ts" ] && [ "$layout" = image ]; then
		snapshot_args=(--snapshot-script "$usr/lib/kata-ts/agent-snapshot.cjs")
	fi
	node "$repo/scripts/build-agent.mjs" --entry "$agent_entry" --out "$usr/lib/kata-ts/agent.mjs" \
		--flags-out "$usr/lib/kata-ts/agent.flags" "${snapshot_args[@]}" ||
		die "bundling the agent from $agent_entry failed"
elif [ "$agent_entry_given" = 1 ]; then
	die "agent entry $agent_entry is missing"
else
	# Until the agent exists the guest still boots and reports ready; init says the agent is missing.
	say "WARNING: $agent_entry is missing: the guest image carries no agent"
fi

inputs=$(
	{
		echo "$pkg $version layout=$layout"
		mkfs.erofs --help 2>&1 | head -n1
		sha256sum "$busybox" "$guest_src/init" "$guest_src/modules.list" "$guest_src/modules-verity.list" \
			"$guest_src/native/verity.c" "$repo/scripts/guest-verity.ts" "$repo/src/measure/verity.ts" \
			"$repo/src/hypervisor/guest-verity.ts" "$0" | awk '{ print $1 }'
		# agent.blob is left out: V8 writes a different blob for the same bundle, node and flags
		# (all hashed here) at every build.
		(cd "$usr" && find . -type f ! -name agent.blob -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
	} | sha256sum | awk '{ print $1 }'
)
outputs=("$out/vmlinuz" "$out/initramfs.cpio.gz")
[ "$layout" = image ] && outputs+=("$out/guest.img" "$out/guest.img.verity.json")
present=1
for f in "${outputs[@]}"; do [ -f "$f" ] || present=0; done
if [ "$force" = 0 ] && [ "$present" = 1 ] && [ "$(cat "$out/.inputs" 2>/dev/null)" = "$inputs" ]; then
	say "up to date in $out (inputs $inputs)"
	exit 0
fi

# --- 3. download and extract the kernel package (cached) -----------------------------------------
mkdir -p "$cache/debs"
deb=$(find "$cache/debs" -maxdepth 1 -name "${pkg}_*.deb" -print | while read -r f; do
	[ "$(dpkg-deb -f "$f" Version)" = "$version" ] && echo "$f"
done | head -n1)
if [ -z "$deb" ]; then
	say "downloading $pkg $version"
	# apt's _apt user may not be able to write to the cache: download as root, quietly.
	(cd "$cache/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$version") >&2 ||
		die "apt-get download $pkg=$version failed"
	deb=$(find "$cache/debs" -maxdepth 1 -name "${pkg}_*.deb" -print | head -n1)
	[ -n "$deb" ] || die "apt-get download left no ${pkg}_*.deb in $cache/debs"
else
	say "using cached $(basename "$deb")"
fi

# Extract into a scratch tree removed on exit: only vmlinuz and a few modules are kept, and the
# .deb stays cached for offline rebuilds.
root=$(mktemp -d "$cache/root.XXXXXX")
say "extracting $(basename "$deb")"
dpkg-deb -x "$deb" "$root" || die "dpkg-deb -x $deb failed"
[ -f "$root/boot/vmlinuz-$kver" ] || die "$deb holds no boot/vmlinuz-$kver"
# Debian generates modules.dep at install time; we never install, so generate it here.
depmod -b "$root" "$kver" || die "depmod for $kver failed"
moddir=lib/modules/$kver

# --- 4. the initramfs -----------------------------------------------------------------------------
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,run,newroot,etc/kata-ts,"$moddir"}

cp "$busybox" "$stage/bin/busybox"
for applet in $("$busybox" --list); do
	[ "$applet" = busybox ] || ln -s busybox "$stage/bin/$applet"
done
ln -s bin "$stage/sbin"
install -m 0755 "$guest_src/init" "$stage/init"
# init's dm-verity helper (guest/native/verity.c): it runs before /usr exists, so it lives here,
# static like the agent's helpers.
gcc -static -Os -Wall -o "$stage/bin/kata-ts-verity" "$guest_src/native/verity.c" ||
	die "gcc -static $guest_src/native/verity.c failed (install gcc and libc6-dev)"
strip "$stage/bin/kata-ts-verity" || die "strip kata-ts-verity failed"
# The dynamic loader of node and crun is /lib64/ld-linux-x86-64.so.2; their libraries are found in
# /usr/lib/x86_64-linux-gnu, a directory glibc always searches.
ln -s usr/lib64 "$stage/lib64"
if [ "$layout" = initramfs ]; then
	cp -a "$usr" "$stage/usr"
else
	mkdir "$stage/usr" # the mount point of guest.img
fi

say "resolving modules against $kver"
declare -A seen=()
# resolve_modules LIST LOAD: every module of LIST with its dependencies, in load order, into LOAD
# (and their files into the initramfs); a module an earlier list took already is not repeated.
resolve_modules() {
	local list=$1 load=$2 module deps kind path rel target
	: >"$load"
	while read -r module _; do
		case "$module" in '' | '#'*) continue ;; esac
		deps=$(modprobe -d "$root" -S "$kver" --show-depends "$module" 2>&1) ||
			die "module $module is unknown to kernel $kver: $deps"
		while read -r kind path _; do
			case "$kind" in
			builtin) continue ;; # compiled into the kernel: nothing to load
			insmod) ;;
			*) die "unexpected modprobe output for $module: $kind $path" ;;
			esac
			rel=${path#"$root"/}
			target=${rel%.xz}
			target=${target%.zst}
			target=${target%.gz}
			[ -n "${seen[$target]:-}" ] && continue
			seen[$target]=1
			mkdir -p "$stage/$(dirname "$target")"
			# busybox insmod cannot read compressed modules: store them decompressed.
			case "$rel" in
			*.ko) cp "$root/$rel" "$stage/$target" ;;
			*.ko.xz) xz -dc "$root/$rel" >"$stage/$target" || die "cannot decompress $rel" ;;
			*.ko.zst) zstd -qdc "$root/$rel" >"$stage/$target" || die "cannot decompress $rel" ;;
			*.ko.gz) gzip -dc "$root/$rel" >"$stage/$target" || die "cannot decompress $rel" ;;
			*) die "unexpected module file $rel" ;;
			esac
			echo "/$target" >>"$load"
		done <<<"$deps"
	done <"$list"
}
load_list=$stage/etc/kata-ts/modules.load
resolve_modules "$guest_src/modules.list" "$load_list"
# Loaded by init only for a pod whose command line carries kata_ts.verity= (a TEE pod).
verity_load_list=$stage/etc/kata-ts/modules-verity.load
resolve_modules "$guest_src/modules-verity.list" "$verity_load_list"
say "$(wc -l <"$load_list") modules: $(sed 's#.*/##; s#\.ko$##' "$load_list" | tr '\n' ' ')"
say "$(wc -l <"$verity_load_list") dm-verity modules: $(sed 's#.*/##; s#\.ko$##' "$verity_load_list" | tr '\n' ' ')"

mkdir -p "$out"
say "writing initramfs"
# Fixed timestamps and sorted names make the archive reproducible for unchanged inputs.
find "$stage" -exec touch -h -d @0 {} +
(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
	cpio --null --create --format=newc --owner=0:0 --reproducible --quiet) |
	gzip -9n >"$out/.initramfs.cpio.gz.tmp" || die "cpio/gzip of the initramfs failed"
cp "$root/boot/vmlinuz-$kver" "$out/.vmlinuz.tmp"

# build_snapshot_in_guest: boots the new kernel, initramfs and (unverified) image once under TCG
# with kata_ts.build_snapshot on the command line; guest/init builds agent.blob with the image's
# node, checks it loads, writes it to a scratch disk and powers off. A TCG vCPU (QEMU's "max", as
# the runtime gives) has no CET and V8 uses no other feature with the image's flags, so the blob
# loads in any VM without CET: TCG's, and KVM's with QEMU 7.2. Without a blob (QEMU missing, the
# boot failed) the agent starts from its bundle: slower, the same program.
build_snapshot_in_guest() {
	local qemu=qemu-system-x86_64 pre=$scratch/pre-snapshot.img disk=$scratch/snapshot.disk console=$scratch/snapshot-console.log bytes
	command -v "$qemu" >/dev/null || {
		say "WARNING: $qemu is not installed: no start-up snapshot for the agent"
		return 0
	}
	find "$usr" -exec touch -h -d @0 {} +
	mkfs.erofs --quiet -T0 --all-root -x-1 "$pre" "$usr" >&2 || die "mkfs.erofs of the snapshot build's image failed"
	truncate -s 256M "$disk"
	say "building the agent's start-up snapshot in the new guest (TCG, one boot)"
	timeout 900 "$qemu" -machine q35 -accel tcg -cpu max -m 1024 -smp 1 -nodefaults -no-reboot \
		-display none -monitor none -serial "file:$console" \
		-kernel "$out/.vmlinuz.tmp" -initrd "$out/.initramfs.cpio.gz.tmp" \
		-append "console=ttyS0 panic=-1 kata_ts.build_snapshot" \
		-drive "if=none,id=img,file=$pre,format=raw,readonly=on" -device virtio-blk-pci,drive=img,serial=kata-ts-guest \
		-drive "if=none,id=snap,file=$disk,format=raw" -device virtio-blk-pci,drive=snap,serial=kata-ts-snapshot \
		>"$scratch/snapshot-qemu.log" 2>&1 || say "the snapshot build's QEMU ended with status $?"
	bytes=$(sed -n 's/.*snapshot build: \([0-9][0-9]*\) bytes written.*/\1/p' "$console" | head -n1)
	if [ -z "$bytes" ]; then
		say "WARNING: the guest built no start-up snapshot; the agent will start from its bundle. Console:"
		grep -a 'kata-ts-init\|snapshot' "$console" | tail -n 20 >&2 || true
		cat "$scratch/snapshot-qemu.log" >&2
		return 0
	fi
	head -c "$bytes" "$disk" >"$usr/lib/kata-ts/agent.blob"
	say "agent.blob: $bytes bytes, built and checked in the guest"
}
rm -f "$usr/lib/kata-ts/agent.blob"
if [ -f "$usr/lib/kata-ts/agent-snapshot.cjs" ]; then
	build_snapshot_in_guest
	# Only the build needs the entry script.
	rm -f "$usr/lib/kata-ts/agent-snapshot.cjs"
fi

mv "$out/.vmlinuz.tmp" "$out/vmlinuz"
mv "$out/.initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
if [ "$layout" = image ]; then
	say "writing guest.img (erofs)"
	find "$usr" -exec touch -h -d @0 {} +
	# Uncompressed: under TCG the guest's decompression is emulated and costs more than reading
	# the bytes through virtio-blk (see guest/README.md for the measurements). Fixed timestamp and
	# UUID, owner root: the same files give the same image.
	rm -f "$out/.guest.img.tmp"
	mkfs.erofs --quiet -T0 -U 6b617461-2d74-732d-6775-657374000001 --all-root -x-1 \
		"$out/.guest.img.tmp" "$usr" >&2 || die "mkfs.erofs of the guest image failed"
	# The dm-verity tree after the image's data, and its table beside it (scripts/guest-verity.ts).
	say "appending the guest image's dm-verity hash tree"
	(cd "$repo" && node --import tsx scripts/guest-verity.ts --image "$out/.guest.img.tmp" \
		--metadata "$out/.guest.img.verity.json.tmp") >&2 || die "the dm-verity tree of the guest image failed"
	mv "$out/.guest.img.tmp" "$out/guest.img"
	mv "$out/.guest.img.verity.json.tmp" "$out/guest.img.verity.json"
else
	rm -f "$out/guest.img" "$out/guest.img.verity.json"
fi
{
	echo "kernel_package=$pkg"
	echo "kernel_version=$version"
	echo "kernel_release=$kver"
	echo "busybox=$("$busybox" 2>&1 | head -n1)"
	echo "modules=$(sed 's#.*/##; s#\.ko$##' "$load_list" | tr '\n' ' ')"
	echo "layout=$layout"
	if [ "$layout" = image ]; then
		echo "image=guest.img"
		echo "image_fs=erofs"
		echo "image_verity_root_hash=$(sed -n 's/.*"rootHash": "\([0-9a-f]*\)".*/\1/p' "$out/guest.img.verity.json")"
	fi
	echo "verity_modules=$(sed 's#.*/##; s#\.ko$##' "$verity_load_list" | tr '\n' ' ')"
	echo "node=$("$usr/bin/node" --version) $(sha256sum "$usr/bin/node" | cut -c1-16)"
	echo "crun=$(dpkg-query -W -f '${Version}' crun 2>/dev/null || echo unknown) $(sha256sum "$usr/bin/crun" | cut -c1-16)"
	if [ -f "$usr/lib/kata-ts/agent.mjs" ]; then
		echo "agent=${agent_entry#"$repo"/} $(sha256sum "$usr/lib/kata-ts/agent.mjs" | cut -c1-16)"
		echo "agent_flags=$(cat "$usr/lib/kata-ts/agent.flags")"
		echo "agent_snapshot=$([ -f "$usr/lib/kata-ts/agent.blob" ] && echo on || echo off)"
	else
		echo "agent=none"
	fi
} >"$out/manifest"
echo "$inputs" >"$out/.inputs"
say "done: $(for f in "${outputs[@]}"; do printf '%s (%s) ' "$f" "$(du -h "$f" | cut -f1)"; done)"
