#!/usr/bin/env bash
# The host-side C helpers kata-ts runs as root, built beside the compiled TypeScript; each rebuilt
# only when its source changed:
# - kata-ts-jailer (native/jailer.c): the last step before a confined QEMU (src/hypervisor/confine.ts),
#   found by defaultJailerBinary() (src/hypervisor/launcher.ts);
# - kata-ts-portfwd (native/portfwd.c): containerd's port-forward into a pod's guest
#   (src/shim/port-forward.ts), found by defaultPortForwardBinary();
# - kata-ts-shim-relay (native/shim-relay.c): a pod's ttrpc relay in front of the node shim server
#   (docs/shim.md#the-relay);
# - kata-ts-shim-start (native/shim-start.c): `start`'s answer without Node when the pod is already served
#   (docs/shim.md#the-start-fast-path).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist/native
for pair in jailer:kata-ts-jailer portfwd:kata-ts-portfwd shim-relay:kata-ts-shim-relay shim-start:kata-ts-shim-start; do
  src="native/${pair%%:*}.c"
  out="dist/native/${pair#*:}"
  if [ -x "$out" ] && [ "$out" -nt "$src" ]; then
    continue
  fi
  gcc -O2 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -o "$out.tmp" "$src"
  mv "$out.tmp" "$out"
done
