#!/usr/bin/env bash
# Install everything kata-ts needs on a Debian 12 machine and start the runtime on its default
# socket (/run/kata-ts/kata-ts.sock). Idempotent: re-running only does what is missing or changed.
#
#   bash scripts/setup.sh             install, build, build guest assets, (re)start the daemon
#   bash scripts/setup.sh --no-start  the same without starting the daemon (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
START=1
for arg in "$@"; do
  case "$arg" in
    --no-start) START=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $arg" >&2; exit 2 ;;
  esac
done
step() { printf '\n==> %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "setup: run as root (it installs packages and writes /usr/local, /run, /var/lib)" >&2; exit 1; }

# System packages: QEMU and guest-image tools for the runtime (crun is copied into the guest image,
# mkfs.erofs writes it, strip trims node for it); the registry, image tools and
# systemd/dbus for the integration tests (real parts, see README "Tests"); the CNI plugins
# (Debian installs them in /usr/lib/cni, one of network.cniBinDirs) and iptables (portmap) for pod
# networking; shellcheck for scripts/test.sh's lint step.
APT_PACKAGES=(
  qemu-system-x86 busybox-static cpio kmod zstd xz-utils
  attr # setfattr: overlay opaque directories when layers are unpacked (src/images/unpack-applier.ts)
  crun erofs-utils binutils gcc libc6-dev
  docker-registry skopeo umoci apache2-utils
  systemd dbus util-linux iproute2 procps
  containernetworking-plugins iptables
  protobuf-compiler ca-certificates shellcheck
  containerd runc # test/integration/ttrpc: our ttrpc client against containerd itself
  ovmf swtpm swtpm-tools tpm2-tools # the confidential lab's vtpm profile: UEFI firmware, a TPM per pod, quotes checked on the host
  jq # docs/confidential.md's worked example builds its pod JSON with it
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # docker-registry's package starts a system service when systemd runs; tests start their own.
else
  step "Debian packages already installed"
fi

command -v node >/dev/null || { echo "setup: Node.js 20 is required (node not found)" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || { echo "setup: Node.js >= 20 is required, found $(node -v)" >&2; exit 1; }

# npm packages: only when the lock file changed since the last install, with `npm ci`: it installs
# exactly the lock file and never writes it, failing instead when the lock does not match
# package.json. `npm install` is not used because it rewrites the lock file whenever the running
# npm would write it differently: npm 11 adds every platform's optional packages (biome's,
# rollup's), and a lock without them came back from setup 479 lines longer. The committed lock
# therefore lists every platform's optional packages, which npm 10 and 11 both accept as is.
# To change dependencies, run `npm install <pkg>` by hand and commit package.json with the lock.
stamp=node_modules/.kata-ts-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  step "installing npm packages (npm ci)"
  npm ci --no-audit --no-fund
  echo "$want" > "$stamp"
else
  step "npm packages up to date"
fi
# A clone must stay as it was checked out: refuse to go on if anything rewrote the lock file.
if [ "$(sha256sum package-lock.json | cut -d' ' -f1)" != "$want" ]; then
  echo "setup: package-lock.json was modified by npm $(npm -v); commit a lock file that npm ci keeps as is" >&2
  exit 1
fi

step "building kata-ts (proto types, TypeScript, the native jailer)"
npm run --silent build
bash scripts/build-native.sh
node bin/kata-ts.js tpm-ca init # the node's CA for vtpm pods' EK certificates (kept when it exists)

# containerd (and CRI-O) find a shim by its binary name on PATH: the runtime type
# io.containerd.kata-ts.v2 runs containerd-shim-kata-ts-v2 (docs/shim.md). A symlink to this clone's
# native start front (native/shim-start.c: a container's `start` answered without Node when its pod
# already answers; everything else it hands to bin/<the same name>, the script that runs
# dist/shim/main.js), so a rebuild is picked up by the next pod. Without the front (not built): the
# script itself.
step "installing the containerd shim: /usr/local/bin/containerd-shim-kata-ts-v2 (and -kata-ts-cvm-v2)"
shim_target="$PWD/bin/containerd-shim-kata-ts-v2"
[[ -x "$PWD/dist/native/kata-ts-shim-start" ]] && shim_target="$PWD/dist/native/kata-ts-shim-start"
ln -sfn "$shim_target" /usr/local/bin/containerd-shim-kata-ts-v2
# The same binary under the confidential handler's name runs kata-ts-cvm pods (src/shim/register.ts;
# the front falls back to bin/containerd-shim-kata-ts-cvm-v2 for that name).
ln -sfn "$shim_target" /usr/local/bin/containerd-shim-kata-ts-cvm-v2

step "building guest kernel, initramfs and image"
bash scripts/build-guest.sh

if [ "$START" = 1 ]; then
  step "starting kata-ts on its default socket"
  bash scripts/start-daemon.sh
fi
