#!/usr/bin/env bash
# Real Horovod 0.28.1 (its last release, from PyPI's source package) in a venv of its own beside
# Debian's torch, for the benchmarks that run it next to dtrain (bench/horovod_bench.py). Cached:
# a venv whose horovodrun --check-build shows PyTorch, Gloo and MPI is kept. About 15 minutes on
# 2 cores the first time.
#
#   bash bench/horovod_venv.sh [VENV]     (default: build/venv/horovod)
#
# Prints the venv's python on its last line. Exits 77 when PyPI cannot be reached.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$repo/build/venv/horovod}
py=$venv/bin/python

built() {  # (the output captured first: grep -q ending a pipe early fails it under pipefail)
  local check
  [[ -x $venv/bin/horovodrun ]] || return 1
  check=$("$venv/bin/horovodrun" --check-build 2>/dev/null) || return 1
  grep -q "\[X\] PyTorch" <<<"$check" && grep -q "\[X\] Gloo" <<<"$check" &&
    grep -q "\[X\] MPI" <<<"$check"
}
if ! built; then
  [[ -x $py ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  if ! timeout 30 "$py" -m pip download -q --no-deps -d "$venv/.probe" horovod==0.28.1 \
      >/dev/null 2>&1; then
    echo "horovod_venv: PyPI cannot be reached: no Horovod to compare with" >&2
    exit 77
  fi
  # horovodrun's own needs (--no-deps keeps pip from replacing Debian's torch).
  timeout 600 "$py" -m pip install -q cloudpickle psutil pyyaml packaging cmake
  echo "horovod_venv: building Horovod 0.28.1 against Debian's torch (about 15 minutes)" >&2
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 timeout 3600 "$py" -m pip install -q \
    --no-build-isolation --no-deps --no-cache-dir horovod==0.28.1
  built || { "$venv/bin/horovodrun" --check-build >&2; echo "horovod_venv: build incomplete" >&2; exit 1; }
fi
echo "$py"
