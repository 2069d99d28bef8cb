#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what setup installs (without starting the
# daemon), type-checks, then runs the unit tests and the integration tests (real QEMU under TCG
# or KVM, real cgroupfs in a private subtree, a confined systemd user manager, a loopback registry).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-start
printf '\n==> type-checking\n'
npx tsc -p tsconfig.json --noEmit
printf '\n==> lint and format (biome ci: fails on any violation, fixes nothing)\n'
npx biome ci .
printf '\n==> shellcheck (scripts, deploy, guest/init, .ci/run)\n'
shopt -s nullglob
shell_files=(scripts/*.sh scripts/conformance/*.sh deploy/*.sh guest/init .ci/run)
shopt -u nullglob
shellcheck "${shell_files[@]}"
printf '\n==> unit tests\n'
npx vitest run --project unit
printf '\n==> integration tests\n'
# Two runs: the files two at a time, then the serial ones alone (vitest.config.ts). The second
# runs even when the first failed, so that one red file does not hide the others' results.
status=0
npx vitest run --project integration || status=$?
npx vitest run --project integration-serial || status=$?
exit "$status"
