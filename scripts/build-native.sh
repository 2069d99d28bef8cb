#!/usr/bin/env bash
# The host-side C helper kata-ts runs as root: kata-ts-jailer (native/jailer.c), the last step before
# a confined QEMU (src/hypervisor/confine.ts). Built beside the compiled TypeScript, where
# defaultJailerBinary() (src/hypervisor/launcher.ts) finds it; rebuilt only when the source changed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist/native/kata-ts-jailer
if [ -x "$out" ] && [ "$out" -nt native/jailer.c ]; then
  exit 0
fi
mkdir -p dist/native
gcc -O2 -Wall -Wextra -Werror -D_FORTIFY_SOURCE=2 -fstack-protector-strong -o "$out.tmp" native/jailer.c
mv "$out.tmp" "$out"
