#!/usr/bin/env bash
# Start (or restart) the kata-ts daemon on its default socket. On a host run by systemd the unit in
# deploy/ is installed and started; elsewhere the daemon runs in the background with a pid file.
# Pod VMs survive a restart: the new daemon finds them again from their records.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SOCKET=/run/kata-ts/kata-ts.sock
PIDFILE=/run/kata-ts/kata-ts.pid
LOG=/var/log/kata-ts.log

if [ -d /run/systemd/system ] && [ "$(ps -o comm= -p 1)" = systemd ]; then
  sed "s|@ROOT@|$ROOT|g" deploy/kata-ts.service > /etc/systemd/system/kata-ts.service
  systemctl daemon-reload
  systemctl enable kata-ts.service >/dev/null
  systemctl restart kata-ts.service
else
  mkdir -p /run/kata-ts
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
     && grep -q kata-ts "/proc/$(cat "$PIDFILE")/cmdline" 2>/dev/null; then
    old=$(cat "$PIDFILE")
    echo "stopping the running kata-ts (pid $old)"
    kill -TERM "$old"
    for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  fi
  # setsid: the daemon must not die with this shell; it writes its own log.
  setsid node "$ROOT/bin/kata-ts.js" serve >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
fi
for _ in $(seq 1 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done
if [ ! -S "$SOCKET" ]; then
  echo "kata-ts did not create $SOCKET; see $LOG" >&2
  tail -n 20 "$LOG" >&2 || true
  exit 1
fi
echo "kata-ts is serving on unix://$SOCKET (log: $LOG)"
echo "try: node $ROOT/bin/kata-ts.js doctor"
