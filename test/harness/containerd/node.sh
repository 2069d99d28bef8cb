#!/usr/bin/env bash
# The "node" of the containerd harness (test/helpers/containerd.ts): run by join.sh through
# `unshare --cgroup --mount --net --propagation private`, so it starts as the only process of new
# cgroup, mount and network namespaces whose cgroup root is the test's private kata-ts-test-*
# cgroup. It makes those namespaces look like a node of their own, prints "ready", and then only
# holds them (containerd is started into them with nsenter, and may be restarted while pods run).
# Environment (set by the harness):
#   KATA_TS_CGROUP_MOUNTS   lines "<dir name> <fstype> <mount options or ->" for each hierarchy
#   KATA_TS_PRIVATE_INODES  lines "<dir name> <inode>" of each private cgroup directory
#   KATA_TS_NODE_CGROUP     the child cgroup (below the namespace's root) this holder moves into
#   KATA_TS_NODE_DIR        the harness's temporary directory (overlay upper layers go there)
#   KATA_TS_NODE_PRIVATE_ROOT  1: leave the root mount private (a host without systemd)
set -euo pipefail

fail() { echo "containerd node: $*" >&2; exit 98; }
while IFS= read -r line; do
  [ -n "$line" ] || continue
  [ "${line##*:}" = "/" ] || fail "the cgroup namespace is not rooted at this shell's cgroup: $line"
done < /proc/self/cgroup

# A sysfs of this network namespace (the inherited one shows the host's interfaces), then the
# cgroup hierarchies again: inside the cgroup namespace they are rooted at the private cgroups, so
# containerd, runc and every shim see a whole cgroup tree that is the test's own.
mount -t sysfs kata-ts-test-sysfs /sys
mount -t tmpfs -o mode=755,size=1m kata-ts-test-cgroup /sys/fs/cgroup
while read -r name fstype options; do
  [ -n "$name" ] || continue
  mkdir -p "/sys/fs/cgroup/$name"
  if [ "$options" = "-" ]; then
    mount -t "$fstype" "$fstype" "/sys/fs/cgroup/$name"
  else
    mount -t "$fstype" -o "$options" "$fstype" "/sys/fs/cgroup/$name"
  fi
done <<< "$KATA_TS_CGROUP_MOUNTS"
while read -r name inode; do
  [ -n "$name" ] || continue
  got="$(stat -c %i "/sys/fs/cgroup/$name")"
  [ "$got" = "$inode" ] || fail "/sys/fs/cgroup/$name is inode $got, not the private cgroup's $inode"
done <<< "$KATA_TS_PRIVATE_INODES"
# The namespace's root cgroup keeps no process of its own (cgroup v2 enables controllers for
# children only then): this holder moves into a child, as containerd does (join.sh).
while read -r name _; do
  [ -n "$name" ] || continue
  echo $$ > "/sys/fs/cgroup/$name/$KATA_TS_NODE_CGROUP/cgroup.procs"
done <<< "$KATA_TS_CGROUP_MOUNTS"

# /run and /var/lib as overlays whose upper layers lie in the test's directory: what containerd
# writes to fixed paths there (/run/containerd/s: shim sockets, hard-coded in 1.6; libcni's cache
# in /var/lib/cni; iptables' lock) stays private, while everything the host has there is seen.
for d in run var/lib; do
  layer="$KATA_TS_NODE_DIR/overlay/${d//\//-}"
  mkdir -p "$layer/upper" "$layer/work"
  mount -t overlay -o "lowerdir=/$d,upperdir=$layer/upper,workdir=$layer/work" kata-ts-test-overlay "/$d"
done
mkdir -p /run/containerd
# Shared, as systemd makes a node's mounts: the runtime's mount namespace (a slave of this one, made
# by the kata-ts shim) then receives what containerd mounts later, the pods' network namespaces.
# KATA_TS_NODE_PRIVATE_ROOT=1 leaves it private, as on a host that runs no systemd.
if [ "${KATA_TS_NODE_PRIVATE_ROOT:-}" != "1" ]; then
  mount --make-rshared /
fi

ip link set dev lo up
echo ready
exec sleep infinity
