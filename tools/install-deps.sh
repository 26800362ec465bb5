#!/bin/sh
# tools/install-deps.sh — install everything sparq needs to build and test on
# Debian (12 or later), from Debian's packages only. Run as root (or with sudo).
# Idempotent: packages already present are left alone.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
PKGS="build-essential meson ninja-build pkg-config python3 \
  libopenblas-dev libzstd-dev libxxhash-dev libjansson-dev \
  libopenmpi-dev openmpi-bin \
  clang libclang-rt-dev \
  unicode-data \
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: installing:$missing"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing
else
  echo "install-deps: all packages present"
fi
