#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs every test with ctest. Tests that cannot run here
# (e.g. no network namespaces in a container without root) skip, and are listed at the end with
# their reasons.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
rc=0
ctest --output-on-failure --timeout 600 -j "$(nproc)" || rc=$?
if grep -q ": Skipped$" Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "== skipped tests and why =="
  grep -A1 ": Skipped$" Testing/Temporary/LastTest.log | grep -v -e "^--$" -e ": Skipped$" | sort | uniq -c
fi
exit "$rc"
