#!/usr/bin/env bash
# Runs the README's `make test` as a new user would, in a clean Debian 12 root built with debootstrap
# from Debian's own packages: proves tools/install_deps.sh installs everything the build and the tests
# need (a package installed by hand on a development machine hides a missing install step).
#
#   sudo tools/clean_root_test.sh            # builds .cache/clean-root once, then tests the working tree
#   CLEAN_ROOT_FRESH=1 sudo tools/clean_root_test.sh   # starts from a new root
#   CLEAN_ROOT_CI=1 sudo tools/clean_root_test.sh      # runs .ci/run (make test + fuzz smoke)
#
# The root gets only `make` beyond debootstrap's minimal base (the README's commands are make targets).
# The checkout copied in is the working tree's tracked and untracked, not ignored, files.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(realpath -m "${CLEAN_ROOT:-.cache/clean-root}")
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" != 0 ]; then
  echo "clean_root_test.sh: needs root (debootstrap, chroot, mounts)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap

if [ "${CLEAN_ROOT_FRESH:-0}" = 1 ]; then rm -rf "$ROOT"; fi
if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
  rm -rf "$ROOT"
  debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR"
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# The host's network trust only (a TLS-inspecting egress proxy has its own CA): node/npm read it
# through NODE_EXTRA_CA_CERTS; nothing else of the host enters the root.
HOST_CA=""
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/host-ca.crt"
  HOST_CA=NODE_EXTRA_CA_CERTS=/etc/host-ca.crt
fi

unmount_all() {
  for m in dev/pts dev proc; do umount -l "$ROOT/$m" 2>/dev/null || true; done
}
trap unmount_all EXIT
mount --bind /dev "$ROOT/dev"
mount --bind /dev/pts "$ROOT/dev/pts"
mount -t proc proc "$ROOT/proc"

# A fresh copy of the checkout, without build outputs or caches.
rm -rf "$ROOT/work/deltaserve"
mkdir -p "$ROOT/work/deltaserve"
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - -cf - | tar -xf - -C "$ROOT/work/deltaserve"

chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 $HOST_CA CI_MODE=${CLEAN_ROOT_CI:-0} \
  /bin/bash -c 'set -e
    if ! command -v make >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make
    fi
    cd /work/deltaserve && if [ "$CI_MODE" = 1 ]; then .ci/run; else make test; fi'
