#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)"
