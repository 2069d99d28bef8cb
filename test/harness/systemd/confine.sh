#!/usr/bin/env bash
# Step 1 of the confinement (see /work/shared/ENVIRONMENT.md and README.md here): this shell moves
# itself - a process the harness started - into the private cgroups the harness created, checks
# that /proc/self/cgroup shows exactly those, and only then enters the new namespaces.
# Environment (set by harness.ts):
#   KATA_TS_PRIVATE_DIRS   newline-separated private cgroup directories, one per hierarchy
#   KATA_TS_EXPECTED_CGROUP the exact /proc/self/cgroup this shell must show after moving
#   KATA_TS_HARNESS_DIR    this directory
set -euo pipefail

while IFS= read -r dir; do
  [ -n "$dir" ] || continue
  case "$(basename "$dir")" in
    kata-ts-test-*) ;;
    *) echo "confine: refusing to join $dir: not a kata-ts-test-* cgroup" >&2; exit 96 ;;
  esac
  echo $$ > "$dir/cgroup.procs"
done <<< "$KATA_TS_PRIVATE_DIRS"

actual="$(cat /proc/$$/cgroup)"
if [ "$actual" != "$KATA_TS_EXPECTED_CGROUP" ]; then
  {
    echo "confine: REFUSING to start systemd: this shell is not in the private cgroups."
    echo "--- expected"; echo "$KATA_TS_EXPECTED_CGROUP"
    echo "--- actual"; echo "$actual"
  } >&2
  exit 97
fi
echo "confine: shell $$ is in the private cgroups" >&2

# --kill-child: if unshare dies, its child (PID 1 of the new pid namespace) gets SIGKILL, and the
# kernel then kills every process left in that namespace (systemd, dbus-daemon, placed processes).
exec unshare --cgroup --mount --pid --fork --mount-proc --propagation private --kill-child \
  bash "$KATA_TS_HARNESS_DIR/inner.sh"
