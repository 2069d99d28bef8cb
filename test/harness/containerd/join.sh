#!/usr/bin/env bash
# Used by test/helpers/containerd.ts for every long-lived process it starts (the node holder and
# each containerd): this shell - a process the harness started - moves itself into private
# cgroups the harness created, checks that /proc/self/cgroup shows exactly those, and only then
# execs its arguments (unshare ..., or nsenter ... containerd), which start there. See
# /work/shared/ENVIRONMENT.md: no cgroup but the test's own kata-ts-test-* tree is ever written.
# Environment (set by the harness, removed before the exec):
#   KATA_TS_JOIN_DIRS      newline-separated cgroup directories to join, one per hierarchy, each
#                          inside a kata-ts-test-* cgroup
#   KATA_TS_JOIN_EXPECTED  the exact /proc/self/cgroup this shell must show after joining
set -euo pipefail

while IFS= read -r dir; do
  [ -n "$dir" ] || continue
  case "$dir" in
    */kata-ts-test-*) ;;
    *) echo "join: refusing to join $dir: not inside a kata-ts-test-* cgroup" >&2; exit 96 ;;
  esac
  echo $$ > "$dir/cgroup.procs"
done <<< "$KATA_TS_JOIN_DIRS"

actual="$(cat /proc/$$/cgroup)"
if [ "$actual" != "$KATA_TS_JOIN_EXPECTED" ]; then
  {
    echo "join: REFUSING to go on: this shell is not in the private cgroups."
    echo "--- expected"; echo "$KATA_TS_JOIN_EXPECTED"
    echo "--- actual"; echo "$actual"
  } >&2
  exit 97
fi

exec env -u KATA_TS_JOIN_DIRS -u KATA_TS_JOIN_EXPECTED "$@"
