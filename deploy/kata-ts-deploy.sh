#!/usr/bin/env bash
# The kata-ts installer DaemonSet's entry point (deploy/kata-ts-deploy.yaml, image from
# deploy/Dockerfile; docs/install.md). The host's filesystem is at /host, its PID 1 is visible
# (hostPID) and the container is privileged.
#
#   kata-ts-deploy.sh install   copy kata-ts and its guest onto the host, add the runtime handlers
#                               to containerd's config, restart containerd, label the node; then wait
#   kata-ts-deploy.sh cleanup   (preStop) unlabel the node, remove the handlers, restart containerd
#
# The release copied onto the host stays on cleanup: running pods' shims still run from it (and
# containerd runs their `delete` from it). `kata-ts release prune` removes releases no process uses.
set -euo pipefail

HOST=${HOST_ROOT:-/host}
PREFIX=/opt/kata-ts
BIN_DIR=/usr/local/bin
GUEST_DIR=/usr/local/share/kata-ts/guest
IMAGE_GUEST=${IMAGE_GUEST:-/opt/kata-ts-guest}
LABEL=kata-ts.dev/runtime
SA=/var/run/secrets/kubernetes.io/serviceaccount

say() { echo "kata-ts-deploy: $*"; }
die() {
	echo "kata-ts-deploy: ERROR: $*" >&2
	exit 1
}
# A command in the host's namespaces (PID 1's), as kata-deploy does.
on_host() { nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; }

label_node() { # value: "true" or null
	[ -n "${NODE_NAME:-}" ] || die "NODE_NAME is not set (the manifest passes spec.nodeName)"
	local value=$1 body
	if [ "$value" = null ]; then body="{\"metadata\":{\"labels\":{\"$LABEL\":null}}}"; else body="{\"metadata\":{\"labels\":{\"$LABEL\":\"$value\"}}}"; fi
	curl --fail --silent --show-error --cacert "$SA/ca.crt" -H "Authorization: Bearer $(cat "$SA/token")" \
		-H 'Content-Type: application/merge-patch+json' -X PATCH --data "$body" \
		"https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}/api/v1/nodes/${NODE_NAME}" >/dev/null
	say "node $NODE_NAME: $LABEL=$value"
}

restart_containerd() {
	say "restarting containerd on the host"
	on_host systemctl restart containerd
	on_host systemctl is-active --quiet containerd || die "containerd is not active after the restart (journalctl -u containerd on the node)"
}

install_guest() {
	# Each file replaced by a rename: a running VM keeps the inode it opened (its guest.img).
	mkdir -p "$HOST$GUEST_DIR"
	for f in "$IMAGE_GUEST"/*; do
		local name tmp
		name=$(basename "$f")
		tmp="$HOST$GUEST_DIR/.$name.kata-ts-deploy"
		cp --preserve=mode "$f" "$tmp"
		mv -f "$tmp" "$HOST$GUEST_DIR/$name"
	done
	say "guest assets in $GUEST_DIR"
}

install() {
	local node_version
	node_version=$(on_host node --version 2>/dev/null) || die "the host has no node on its PATH: kata-ts's shim needs Node.js 20 or later there"
	case "$node_version" in v2[0-9].* | v[3-9][0-9].*) ;; *) die "the host's node is $node_version: kata-ts needs Node.js 20 or later" ;; esac
	kata-ts release install --prefix "$HOST$PREFIX" --bin-dir "$HOST$BIN_DIR"
	install_guest
	kata-ts install --containerd --host-root "$HOST" --containerd-version "$(on_host containerd --version)"
	restart_containerd
	label_node true
	say "installed; waiting (the pod's removal runs cleanup)"
	sleep infinity &
	wait $!
}

cleanup() {
	label_node null || say "could not unlabel the node (continuing)"
	kata-ts uninstall --containerd --host-root "$HOST"
	restart_containerd
	say "removed the runtime handlers; the release under $PREFIX stays for running pods (kata-ts release prune)"
}

case "${1:-}" in
install) install ;;
cleanup) cleanup ;;
*) die "usage: kata-ts-deploy.sh install|cleanup" ;;
esac
