#!/usr/bin/env bash
# Configures and builds dtrain (Release) into ./build.
#   build.sh [run] [cmake args]  only what `cmake --install` installs: the libraries, the dtrain and
#                                dtrain-train commands and the Python package (the dtrain_runtime
#                                target). A new build folder is configured without the tests,
#                                benchmarks and examples; one configured with them keeps them.
#   build.sh all [cmake args]    everything: the tests, benchmarks and examples too (scripts/test.sh)
# Configure and build times are printed (scripts/lib/phases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phases.sh
what=run
if [[ ${1:-} == run || ${1:-} == all ]]; then
  what=$1
  shift
fi
options=()
target=(dtrain_runtime)
if [[ $what == all ]]; then
  options=(-DDTRAIN_BUILD_TESTS=ON -DDTRAIN_BUILD_BENCH=ON -DDTRAIN_BUILD_EXAMPLES=ON)
  target=()
elif [[ ! -f build/CMakeCache.txt ]]; then
  options=(-DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_BUILD_EXAMPLES=OFF)
fi
# ccache, where installed: `pip install .` (scripts/test-pip.sh, same settings) then recompiles
# little of what this build compiled. Paths relative to the checkout, and precompiled headers
# allowed, so that build folders beside this one share the cache.
if command -v ccache >/dev/null; then
  options+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$PWD
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
fi
phase "configure ($what)" cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${options[@]}" "$@" >/dev/null
phase "build ($what)" ninja -C build "${target[@]}"
phase_summary
