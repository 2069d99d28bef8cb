#!/usr/bin/env bash
# Build the kata-ts guest: the Debian kernel (extracted from its .deb, never installed on the host)
# and a small initramfs (busybox-static, the kernel modules in guest/modules.list with their
# dependencies, guest/init).
#
#   scripts/build-guest.sh [--out DIR] [--cache DIR] [--force]
#
#   --out DIR    where vmlinuz and initramfs.cpio.gz go (default /usr/local/share/kata-ts/guest)
#   --cache DIR  downloaded and extracted kernel packages (default /var/cache/kata-ts/guest-build)
#   --force      rebuild even when the inputs have not changed
#
# Needs: apt-get, apt-cache, dpkg-deb, depmod and modprobe (kmod), cpio, gzip, busybox-static.
# Idempotent: when the kernel package, busybox, guest/ and this script are unchanged, it only
# says so. Every failure stops the script with a message naming what failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=/usr/local/share/kata-ts/guest
cache=/var/cache/kata-ts/guest-build
force=0

say() { echo "build-guest: $*" >&2; }
die() {
	echo "build-guest: ERROR: $*" >&2
	exit 1
}

while [ $# -gt 0 ]; do
	case "$1" in
	--out) out=${2:?--out needs a directory}; shift 2 ;;
	--cache) cache=${2:?--cache needs a directory}; shift 2 ;;
	--force) force=1; shift ;;
	-h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

for tool in apt-get apt-cache dpkg-deb depmod modprobe cpio gzip sha256sum; do
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

# --- 1. which kernel ----------------------------------------------------------------------------
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-amd64$/ { print $2; exit }')
[ -n "$pkg" ] || die "cannot resolve the package linux-image-amd64 depends on (run apt-get update?)"
version=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '$1 == "Version:" { print $2; exit }')
[ -n "$version" ] || die "apt-cache knows no version of $pkg"
kver=${pkg#linux-image-}
say "guest kernel: $pkg $version"

inputs=$(
	{
		echo "$pkg $version"
		sha256sum "$busybox" "$guest_src/init" "$guest_src/modules.list" "$0" | awk '{ print $1 }'
	} | sha256sum | awk '{ print $1 }'
)
if [ "$force" = 0 ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initramfs.cpio.gz" ] &&
	[ "$(cat "$out/.inputs" 2>/dev/null)" = "$inputs" ]; then
	say "up to date in $out (inputs $inputs)"
	exit 0
fi

# --- 2. download and extract the kernel package (cached) -----------------------------------------
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
stage=$(mktemp -d "${TMPDIR:-/tmp}/kata-ts-guest.XXXXXX")
root=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$stage" "$root"' EXIT
say "extracting $(basename "$deb")"
dpkg-deb -x "$deb" "$root" || die "dpkg-deb -x $deb failed"
[ -f "$root/boot/vmlinuz-$kver" ] || die "$deb holds no boot/vmlinuz-$kver"
# Debian generates modules.dep at install time; we never install, so generate it here.
depmod -b "$root" "$kver" || die "depmod for $kver failed"
moddir=lib/modules/$kver

# --- 3. the initramfs -----------------------------------------------------------------------------
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,run,etc/kata-ts,"$moddir"}

cp "$busybox" "$stage/bin/busybox"
for applet in $("$busybox" --list); do
	[ "$applet" = busybox ] || ln -s busybox "$stage/bin/$applet"
done
ln -s bin "$stage/sbin"
install -m 0755 "$guest_src/init" "$stage/init"

say "resolving modules against $kver"
load_list=$stage/etc/kata-ts/modules.load
: >"$load_list"
declare -A seen=()
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
		echo "/$target" >>"$load_list"
	done <<<"$deps"
done <"$guest_src/modules.list"
say "$(wc -l <"$load_list") modules: $(sed 's#.*/##; s#\.ko$##' "$load_list" | tr '\n' ' ')"

mkdir -p "$out"
say "writing initramfs"
# Fixed timestamps and sorted names make the archive reproducible for unchanged inputs.
find "$stage" -exec touch -h -d @0 {} +
(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
	cpio --null --create --format=newc --owner=0:0 --reproducible --quiet) |
	gzip -9n >"$out/.initramfs.cpio.gz.tmp" || die "cpio/gzip of the initramfs failed"
cp "$root/boot/vmlinuz-$kver" "$out/.vmlinuz.tmp"
mv "$out/.vmlinuz.tmp" "$out/vmlinuz"
mv "$out/.initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
{
	echo "kernel_package=$pkg"
	echo "kernel_version=$version"
	echo "kernel_release=$kver"
	echo "busybox=$("$busybox" 2>&1 | head -n1)"
	echo "modules=$(sed 's#.*/##; s#\.ko$##' "$load_list" | tr '\n' ' ')"
} >"$out/manifest"
echo "$inputs" >"$out/.inputs"
say "done: $out/vmlinuz ($(du -h "$out/vmlinuz" | cut -f1)), $out/initramfs.cpio.gz ($(du -h "$out/initramfs.cpio.gz" | cut -f1))"
