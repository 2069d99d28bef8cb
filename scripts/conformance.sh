#!/usr/bin/env bash
# CRI conformance: upstream critest against a kata-ts daemon of its own, judged by the ratchet in
# test/conformance/; or through Debian's containerd 1.6.20 with the kata-ts shim as runtime handler
# `kata-ts`, judged by test/conformance/containerd/; or the same containerd with runc, the
# reference. Arguments go to critest (e.g. -ginkgo.focus='Runtime info', -ginkgo.skip=...).
#
#   bash scripts/conformance.sh [critest flags...]                    # standalone (kata-ts serve)
#   bash scripts/conformance.sh --containerd [critest flags...]       # containerd + kata-ts handler
#   bash scripts/conformance.sh --containerd-runc [critest flags...]  # containerd + runc (reference)
#
# Environment:
#   CRITEST               the critest binary (default: the first critest on PATH, else
#                         shared/cri-tools/critest beside the checkout, or beside the main
#                         checkout of a git worktree)
#   CRITEST_IMAGES        critest-images.py (default: beside the critest binary, else in that
#                         shared/cri-tools/)
#   CONFORMANCE_CONTAINERD  with --containerd / --containerd-runc: the containerd release, 1.6
#                         (default: Debian 12's, on PATH, judged by test/conformance/containerd/),
#                         1.7 (trixie's) or 2.1 (sid's), fetched into .cache/debs by apt's own
#                         client and judged by test/conformance/containerd/<release>/
#   CONFORMANCE_PARALLEL  critest processes, each on its share of the specs (default 2)
#   CONFORMANCE_TIMEOUT   critest's suite timeout (ginkgo duration, default 45m)
#   CONFORMANCE_OUT       where the reports and logs are kept (default /tmp/kata-ts-conformance)
#   CONFORMANCE_POOL      standalone only: pooled VMs kept for handler kata-ts (default 0), so
#                         critest's pods take pre-booted VMs when one is ready (docs/pool.md)
#   KATA_TS_GUEST_DIR     the guest (vmlinuz, initramfs, guest.img) to boot instead of the installed
#                         one, e.g. one built from this tree by 'scripts/build-guest.sh --out DIR'
#   CONFORMANCE_BUSYBOX   busybox binary the stand-in images are built from (default: Debian's
#                         non-static busybox package, unpacked into .cache/conformance)
#   CONFORMANCE_UPDATE=1  add newly passing specs to test/conformance/expected.txt
#   CONFORMANCE_STRICT=1  fail when a spec passes that expected.txt does not list
#   CONFORMANCE_INTROSPECT=0  with --containerd and a 2.x release: write the kata-ts handler as
#                         installs do (runtime_type io.containerd.kata-ts.v2) instead of runc-typed
#                         with runtime_path naming the shim, the form in which containerd 2.1 asks
#                         the shim's -info for its OCI features (recursive read-only mounts)
#   CONFORMANCE_SHIM_TSX=1  with --containerd: the shim runs this checkout's sources through tsx
#                         (dist/, which others' runs may be using, is neither built nor read;
#                         combine with CONFORMANCE_BUILD=0); slower to start on a loaded machine
#   CONFORMANCE_BUILD=0   with --containerd: use dist/ as it is instead of rebuilding it (a second
#                         run started beside a running one must not rewrite the shim it runs)
#   CONFORMANCE_IF_AVAILABLE=1  exit 0 with a notice when there is no critest (what .ci/run sets);
#                         otherwise a missing critest is an error (exit 2)
#
# Everything runs in private mount, IPC and network namespaces (loopback only), so critest's own
# host-side steps (bind mounts, ipcmk, listening on :0) touch nothing outside; VMMs go into a
# private kata-ts-test-* cgroup tree. All of it is removed at the end, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

mode=standalone
label=standalone
case ${1:-} in
  --containerd) mode=containerd label=containerd && shift ;;
  --containerd-runc) mode=runc label='containerd + runc reference' && shift ;;
esac

# cri-tools' binaries are built from fetched source, so the repository never carries them. critest
# is looked up as test/helpers/cri-tools.ts looks tools up: $CRITEST, then PATH, then
# shared/cri-tools/ beside the checkout (for a git worktree, also beside its main checkout).
shared_dirs=("$(dirname "$repo")/shared")
if common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
  main_shared=$(dirname "$(dirname "$common")")/shared
  [[ $main_shared == "${shared_dirs[0]}" ]] || shared_dirs+=("$main_shared")
fi
critest=
if [[ -n ${CRITEST:-} ]]; then
  [[ -f $CRITEST && -x $CRITEST ]] && critest=$CRITEST
  where="CRITEST=$CRITEST is not an executable file"
else
  critest=$(command -v critest || true)
  for dir in "${shared_dirs[@]}"; do
    [[ -z $critest && -f $dir/cri-tools/critest && -x $dir/cri-tools/critest ]] && critest=$dir/cri-tools/critest
  done
  where="CRITEST is unset, critest is not on PATH, and not in ${shared_dirs[*]/%//cri-tools}"
fi
if [[ -z $critest ]]; then
  if [[ ${CONFORMANCE_IF_AVAILABLE:-} == 1 ]]; then
    echo "==> conformance ($label): skipped, critest (kubernetes-sigs/cri-tools v1.32) not found: $where." \
      "To run it, set CRITEST=/path/to/critest, put critest on PATH, or place it in shared/cri-tools/ beside the checkout."
    exit 0
  fi
  cat >&2 <<EOF
conformance: critest (kubernetes-sigs/cri-tools v1.32) not found: $where.
  Set CRITEST=/path/to/critest, put critest on PATH, or place it in shared/cri-tools/ beside the
  checkout (critest-images.py is looked for beside the binary, then in shared/cri-tools/).
EOF
  exit 2
fi
critest=$(realpath "$critest")
images=${CRITEST_IMAGES:-}
if [[ -z $images ]]; then
  for candidate in "$(dirname "$critest")" "${shared_dirs[@]/%//cri-tools}"; do
    if [[ -f $candidate/critest-images.py ]]; then
      images=$candidate/critest-images.py
      break
    fi
  done
fi
if [[ ! -f $images ]]; then
  echo "conformance: critest-images.py not found${images:+ at $images} (set CRITEST_IMAGES, or keep it in shared/cri-tools/)" >&2
  exit 2
fi
if ! command -v python3 >/dev/null; then
  # critest-images.py needs it; setup.sh does not install it (the project itself has no Python).
  echo "==> conformance: installing python3"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi
tools=(python3 unshare ip docker-registry)
[[ $mode == standalone ]] || tools+=(containerd containerd-shim-runc-v2 runc nsenter)
for tool in "${tools[@]}"; do
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

release=${CONFORMANCE_CONTAINERD:-1.6}
if [[ $mode != standalone ]]; then
  case $release in
    1.6) ;;
    1.7 | 2.1)
      label="$label $release"
      # Fetched (or found in the cache) here, while the archive is reachable: the run itself is
      # loopback only.
      node --import tsx scripts/conformance/fetch-release.ts "$release" ;;
    *) echo "conformance: CONFORMANCE_CONTAINERD must be 1.6, 1.7 or 2.1, not '$release'" >&2 && exit 2 ;;
  esac
fi

if [[ $mode == containerd && ${CONFORMANCE_BUILD:-1} != 0 ]]; then
  # containerd starts the shim for every pod and runs `shim delete` with a short timeout: the shim
  # of this checkout runs compiled, as installed (dist/ is not tracked), not through tsx.
  echo "==> conformance ($label): building the shim (npm run build)"
  npm run build --silent >/dev/null
fi

work=$(mktemp -d /tmp/ktc-XXXXXX)
# shellcheck disable=SC2317  # called by the EXIT trap, which shellcheck 0.9 does not follow
cleanup() {
  # The driver cleans up itself; this catches what a killed driver left (idempotent).
  if [[ -d $work ]]; then
    node --import tsx scripts/conformance/cleanup.ts "$work" || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> conformance ($label): critest $("$critest" -version 2>/dev/null | head -1 || true), work dir $work"
set +e
# Inside the private mount namespace (whose mounts unshare made private copies) / is made rshared,
# as systemd makes a host's mounts: the runtime's own mount namespace, which `kata-ts serve` makes
# as a slave of this one (mountNamespacePath in the run's work dir), receives critest's mounts.
KTC_MODE=$mode CONFORMANCE_CONTAINERD=$release KTC_WORK=$work TMPDIR=$work CRITEST=$critest CRITEST_IMAGES=$images CONFORMANCE_BUSYBOX=$busybox \
  CONFORMANCE_PARALLEL=${CONFORMANCE_PARALLEL:-2} \
  unshare --mount --ipc --net --fork -- \
  bash -c 'ip link set lo up && mount --make-rshared / && exec node --import tsx scripts/conformance/run.ts "$@"' conformance "$@"
status=$?
set -e
exit "$status"
