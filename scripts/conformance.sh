#!/usr/bin/env bash
# CRI conformance: upstream critest against a kata-ts daemon of its own, judged by the ratchet in
# test/conformance/. Arguments go to critest (e.g. -ginkgo.focus='Runtime info', -ginkgo.skip=...).
#
#   bash scripts/conformance.sh [critest flags...]
#
# Environment:
#   CRITEST               the critest binary (default: ../shared/cri-tools/critest next to the repo)
#   CRITEST_IMAGES        critest-images.py (default: next to the critest binary)
#   CONFORMANCE_PARALLEL  critest processes, each on its share of the specs (default 2)
#   CONFORMANCE_TIMEOUT   critest's suite timeout (ginkgo duration, default 45m)
#   CONFORMANCE_OUT       where the reports and logs are kept (default /tmp/kata-ts-conformance)
#   KATA_TS_GUEST_DIR     the guest (vmlinuz, initramfs, guest.img) to boot instead of the installed
#                         one, e.g. one built from this tree by 'scripts/build-guest.sh --out DIR'
#   CONFORMANCE_BUSYBOX   busybox binary the stand-in images are built from (default: Debian's
#                         non-static busybox package, unpacked into .cache/conformance)
#   CONFORMANCE_UPDATE=1  add newly passing specs to test/conformance/expected.txt
#   CONFORMANCE_STRICT=1  fail when a spec passes that expected.txt does not list
#   CONFORMANCE_IF_AVAILABLE=1  exit 0 with a notice when there is no critest (what .ci/run sets);
#                         otherwise a missing critest is an error (exit 2)
#
# Everything runs in private mount, IPC and network namespaces (loopback only), so critest's own
# host-side steps (bind mounts, ipcmk, listening on :0) touch nothing outside; VMMs go into a
# private kata-ts-test-* cgroup tree. All of it is removed at the end, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

default_critest=$repo/../shared/cri-tools/critest
if [[ ! -e $default_critest ]] && common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
  # A git worktree: shared/ sits beside the main checkout.
  default_critest=$(dirname "$(dirname "$common")")/shared/cri-tools/critest
fi
critest=${CRITEST:-$default_critest}
if [[ ! -x $critest ]]; then
  if [[ ${CONFORMANCE_IF_AVAILABLE:-} == 1 ]]; then
    echo "==> conformance: skipped, no critest binary at $critest (set CRITEST to run it)"
    exit 0
  fi
  cat >&2 <<EOF
conformance: no critest binary at $critest.
  Set CRITEST=/path/to/critest, or put cri-tools v1.32 next to the repository as
  ../shared/cri-tools/critest (with critest-images.py beside it). critest is built from
  kubernetes-sigs/cri-tools v1.32.0: 'go test -c ./cmd/critest -o critest'.
EOF
  exit 2
fi
critest=$(realpath "$critest")
images=${CRITEST_IMAGES:-$(dirname "$critest")/critest-images.py}
if [[ ! -f $images ]]; then
  echo "conformance: critest-images.py not found at $images (set CRITEST_IMAGES)" >&2
  exit 2
fi
if ! command -v python3 >/dev/null; then
  # critest-images.py needs it; setup.sh does not install it (the project itself has no Python).
  echo "==> conformance: installing python3"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi
for tool in python3 unshare ip docker-registry; do
  if ! command -v "$tool" >/dev/null; then
    echo "conformance: $tool is missing; run 'bash scripts/setup.sh --no-start' first" >&2
    exit 2
  fi
done
if [[ ! -d node_modules ]]; then
  echo "conformance: node_modules is missing; run 'bash scripts/setup.sh --no-start' first" >&2
  exit 2
fi
if [[ $(id -u) != 0 ]]; then
  echo "conformance: must run as root (namespaces, cgroups, QEMU)" >&2
  exit 2
fi

# critest-images.py builds the images from a busybox binary. Debian's busybox-static runs applets
# without a PATH lookup, which makes "should support MaskedPaths" fail because of the image, so the
# non-static binary of Debian's busybox package is used (fetched once with apt-get download and
# unpacked, never installed: it conflicts with busybox-static).
busybox=${CONFORMANCE_BUSYBOX:-}
if [[ -z $busybox ]]; then
  cache=$repo/.cache/conformance
  busybox=$cache/busybox/bin/busybox
  if [[ ! -x $busybox ]]; then
    rm -rf "$cache/dl" "$cache/busybox" && mkdir -p "$cache/dl"
    if ! (cd "$cache/dl" && apt-get download -qq busybox >/dev/null 2>&1 && dpkg-deb -x busybox_*.deb "$cache/busybox"); then
      echo "conformance: could not fetch Debian's busybox package; the images are built from /bin/busybox" >&2
      busybox=/bin/busybox
    fi
    rm -rf "$cache/dl"
  fi
fi

work=$(mktemp -d /tmp/ktc-XXXXXX)
cleanup() {
  # The driver cleans up itself; this catches what a killed driver left (idempotent).
  if [[ -d $work ]]; then
    node --import tsx scripts/conformance/cleanup.ts "$work" || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> conformance: critest $("$critest" -version 2>/dev/null | head -1 || true), work dir $work"
set +e
# Inside the private mount namespace (whose mounts unshare made private copies) / is made rshared,
# so the daemon's own namespace, a slave of this one (run.ts), still receives critest's mounts.
KTC_WORK=$work TMPDIR=$work CRITEST=$critest CRITEST_IMAGES=$images CONFORMANCE_BUSYBOX=$busybox \
  CONFORMANCE_PARALLEL=${CONFORMANCE_PARALLEL:-2} \
  unshare --mount --ipc --net --fork -- \
  bash -c 'ip link set lo up && mount --make-rshared / && exec node --import tsx scripts/conformance/run.ts "$@"' conformance "$@"
status=$?
set -e
exit "$status"
