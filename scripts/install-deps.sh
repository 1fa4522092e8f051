#!/usr/bin/env bash
# Installs the Debian packages dtrain needs. Idempotent; run as root (or with sudo available) on
# Debian 12.
#   install-deps.sh [run]  what building and running needs: the toolchain, the libraries, LibTorch
#                          and Debian's PyTorch, Gloo and OpenMPI, the Fashion-MNIST data set
#                          (scripts/run-main-job.sh; also what `pip install ./dtrain` builds with)
#   install-deps.sh test   that and what the tests use: GoogleTest and Google Benchmark, sshd,
#                          a single-node Slurm and Grid Engine, clang for the fuzzers, Chromium...
set -euo pipefail
set_name=${1:-run}

run_packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # ccache: the pip builds (scripts/test-pip.sh) reuse the main build's objects of the core
  ccache
  # libraries: networking (standalone Asio), CLI, JSON, OpenSSL (HMAC-SHA256 for authenticated
  # jobs)
  libasio-dev libcli11-dev nlohmann-json3-dev libssl-dev
  # the training front end: LibTorch, OpenBLAS (LibTorch otherwise falls back to the slow
  # reference BLAS), zlib for reading .gz data sets, and the real Fashion-MNIST data set
  libtorch-dev libopenblas0-pthread zlib1g-dev dataset-fashion-mnist
  # allreduce mode: Gloo and OpenMPI (mpirun is also a launcher backend)
  libgloo-dev openmpi-bin libopenmpi-dev
  # the Python package: Debian's PyTorch (the same LibTorch as above) and pybind11
  python3-dev python3-torch python3-numpy pybind11-dev
)

test_packages=(
  # the C++ tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # what the tests and the launcher use: ip (network namespaces), procps (pgrep/pkill), nft (the
  # link-fault tests drop and duplicate packets with it: the kernel may lack netem)
  iproute2 procps nftables
  # the launcher backends' tests: ssh (sshd in namespaces, rsync for --sync-dst-dir), a
  # single-node Slurm (with munge), a single-node Grid Engine
  openssh-server openssh-client rsync
  slurmd slurmctld slurm-client munge gridengine-master gridengine-exec gridengine-client
  # the Python suite, and `pip install` of dtrain into virtual environments with PyPI's torch 2
  # or Debian's
  python3-pytest python3-venv python3-pip
  # the fuzzers (scripts/fuzz.sh): clang with libFuzzer and the sanitizers
  clang libclang-rt-14-dev
  # plots (dtrain plot); the status page's test renders it in headless Chromium and reads the
  # screenshot with tesseract
  python3-matplotlib chromium tesseract-ocr tesseract-ocr-eng
  # Spark's JVM, for tests/python/test_spark.py (pyspark itself comes from PyPI, in the pip lane)
  openjdk-17-jre-headless
  # the kubernetes launcher: its YAML (--dry-run) and Kubernetes' official client, which
  # test_kubernetes_api.py drives against a stand-in API server
  python3-yaml python3-kubernetes
)

case $set_name in
  run) packages=("${run_packages[@]}") ;;
  test) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  *) echo "install-deps: unknown set '$set_name' (run, test)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages of the $set_name set already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# openjdk's postinst links its man pages there, and slim Debian images drop the folder.
$SUDO mkdir -p /usr/share/man/man1
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
