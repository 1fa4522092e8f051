#!/usr/bin/env bash
# Installs every Debian package dtrain needs to build, test and run. Idempotent; run as root (or
# with sudo available) on Debian 12.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # ccache: the pip builds (scripts/test-pip.sh) reuse the main build's objects of the core
  ccache
  # libraries: networking (standalone Asio), CLI, JSON, tests, benchmarks, OpenSSL (HMAC-SHA256
  # for authenticated jobs)
  libasio-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
  # the training front end: LibTorch, OpenBLAS (LibTorch otherwise falls back to the slow
  # reference BLAS), zlib for reading .gz data sets, and the real Fashion-MNIST data set
  libtorch-dev libopenblas0-pthread zlib1g-dev dataset-fashion-mnist
  # what the tests and the launcher use: ip (network namespaces), procps (pgrep/pkill), nft (the
  # link-fault tests drop and duplicate packets with it: the kernel may lack netem)
  iproute2 procps nftables
  # the launcher backends and their tests: ssh (sshd in namespaces, rsync for --sync-dst-dir),
  # OpenMPI, a single-node Slurm (with munge), a single-node Grid Engine
  openssh-server openssh-client rsync openmpi-bin libopenmpi-dev
  slurmd slurmctld slurm-client munge gridengine-master gridengine-exec gridengine-client
  # allreduce mode: Gloo (OpenMPI above is the other backend)
  libgloo-dev
  # the Python package: Debian's PyTorch (the same LibTorch as above), pybind11, and pytest
  python3-dev python3-torch python3-numpy pybind11-dev python3-pytest
  # virtual environments: `pip install` of dtrain into one, with PyPI's torch 2 or Debian's
  python3-venv python3-pip
  # the fuzzers (scripts/fuzz.sh): clang with libFuzzer and the sanitizers
  clang libclang-rt-14-dev
  # plots (dtrain plot); the status page's test renders it in headless Chromium and reads the
  # screenshot with tesseract
  python3-matplotlib chromium tesseract-ocr tesseract-ocr-eng
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
