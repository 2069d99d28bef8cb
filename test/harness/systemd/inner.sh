#!/usr/bin/env bash
# Steps 3-7 of the confinement, run as PID 1 of new cgroup, mount and pid namespaces whose cgroup
# root is the private cgroup. Environment (set by harness.ts):
#   KATA_TS_CGROUP_MOUNTS  lines "<dir name> <fstype> <mount options>" for each hierarchy
#   KATA_TS_PRIVATE_INODES lines "<dir name> <inode>" of each private cgroup directory
#   KATA_TS_WORK_DIR       the test's private directory (bus socket, runtime dir, logs, results)
#   KATA_TS_SCENARIO       the TypeScript scenario to run inside, with node --import tsx
#   KATA_TS_REPO           the repository root (cwd for node)
set -euo pipefail

fail() { echo "inner: $*" >&2; exit 98; }
[ "$$" = 1 ] || fail "not PID 1 of a new pid namespace (pid $$)"
while IFS= read -r line; do
  [ -n "$line" ] || continue
  [ "${line##*:}" = "/" ] || fail "cgroup namespace root is not this shell's cgroup: $line"
done < /proc/self/cgroup

# 3. cgroup hierarchies again, rooted at the namespace's root (= the private cgroup).
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
# The mounts must show the private cgroups (same kernfs node => same inode), nothing else.
while read -r name inode; do
  [ -n "$name" ] || continue
  got="$(stat -c %i "/sys/fs/cgroup/$name")"
  [ "$got" = "$inode" ] || fail "/sys/fs/cgroup/$name is inode $got, not the private cgroup's $inode"
done <<< "$KATA_TS_PRIVATE_INODES"

# 4. systemd refuses to run as a manager unless /run/systemd/system exists.
mount -t tmpfs -o mode=755,size=1m kata-ts-test-run /run/systemd
mkdir /run/systemd/system

# 5. A private session bus and a user manager on it. The user manager connects to its API bus
# only once ITS OWN dbus.socket and dbus.service units are running (systemd's
# manager_dbus_is_running), so the private dbus-daemon --session is started by the manager itself
# through units of those names, overriding the packaged ones, listening on the test's own socket.
work="$KATA_TS_WORK_DIR"
units="$work/config/systemd/user"
mkdir -p "$work/xdg" "$work/home" "$units"
chmod 700 "$work/xdg"
cat > "$units/dbus.socket" <<UNIT
[Unit]
Description=kata-ts test session bus socket
DefaultDependencies=no
[Socket]
ListenStream=$work/bus
UNIT
cat > "$units/dbus.service" <<UNIT
[Unit]
Description=kata-ts test session bus
Requires=dbus.socket
After=dbus.socket
DefaultDependencies=no
[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/bin/dbus-daemon --session --address=systemd: --nofork --nopidfile --systemd-activation
StandardOutput=append:$work/dbus.log
StandardError=append:$work/dbus.log
UNIT
# Started on a target of our own so that the manager starts none of the other packaged user
# units (gpg-agent sockets, tmpfiles, ...).
cat > "$units/kata-ts-test.target" <<UNIT
[Unit]
Description=kata-ts test target
DefaultDependencies=no
Wants=dbus.socket dbus.service
After=dbus.socket dbus.service
UNIT
export DBUS_SESSION_BUS_ADDRESS="unix:path=$work/bus"
export XDG_RUNTIME_DIR="$work/xdg" HOME="$work/home" XDG_CONFIG_HOME="$work/config"
/lib/systemd/systemd --user --unit=kata-ts-test.target --log-level=info --log-target=console --log-color=no > "$work/systemd.log" 2>&1 &
sd_pid=$!
echo "$sd_pid" > "$work/systemd.pid"

# 6. The code under test, in these namespaces (StartTransientUnit resolves PIDs here).
set +e
(cd "$KATA_TS_REPO" && node --import tsx "$KATA_TS_SCENARIO")
rc=$?
set -e

# 7. Stop systemd (SIGTERM starts its exit; SIGKILL if it dawdles). Whatever is left (the bus,
# placed processes) dies with this PID 1 when it exits.
kill -TERM "$sd_pid" 2>/dev/null || true
for _ in $(seq 1 100); do kill -0 "$sd_pid" 2>/dev/null || break; sleep 0.05; done
kill -KILL "$sd_pid" 2>/dev/null || true
wait 2>/dev/null || true
exit "$rc"
