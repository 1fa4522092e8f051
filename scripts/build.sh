#!/usr/bin/env bash
# Configures and builds dtrain (Release) into ./build. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
# ccache, where installed: `pip install .` (scripts/test-pip.sh, same settings) then recompiles
# little of what this build compiled. Paths relative to the checkout, and precompiled headers
# allowed, so that build folders beside this one share the cache.
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$PWD
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
ninja -C build
