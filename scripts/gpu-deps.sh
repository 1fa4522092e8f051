#!/usr/bin/env bash
# Fetches, on a machine with Debian 12's package archive, what building dtrain needs beyond a GPU
# machine's own CUDA build of PyTorch, nvcc, CMake and ninja, into one folder (about 10 MB) that
# scripts/gpu-check.sh takes on a machine with no network:
#
#   bash scripts/gpu-deps.sh [DIR]          # default build/gpu-deps
#
# The packages (.deb, unpacked there by gpu-check.sh, never installed): Gloo and the libraries it
# loads, the header-only libraries (nlohmann-json, CLI11, Asio), OpenSSL's and zlib's headers,
# GoogleTest. OpenMPI is left out (the collectives then run on Gloo only).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/gpu-deps}
packages=(
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  nlohmann-json3-dev libcli11-dev libasio-dev
  libssl-dev libssl3 zlib1g-dev
  libgtest-dev libgmock-dev
)
rm -rf "$dir"
mkdir -p "$dir/debs"
# apt's sandbox user must be able to write there.
tmp=$(mktemp -d)
chmod 777 "$tmp"
(cd "$tmp" && apt-get download "${packages[@]}")
for deb in "$tmp"/*.deb; do  # names without apt's %3a (an epoch's colon)
  name=$(basename "$deb")
  mv "$deb" "$dir/debs/${name//%3a/_}"
done
rm -rf "$tmp"
du -sh "$dir"
