#!/usr/bin/env bash
# Sets up (installs, scripts/install.sh), then runs every test with ctest: the C++ suites, the
# Python package's pytest files, and the check of the installed package from outside the tree;
# then `pip install` into virtual environments with PyPI's torch 2 and with Debian's torch
# (scripts/test-pip.sh: the Python suite again on the pip-installed package, and a wheel); then a
# short run of each fuzzer (scripts/fuzz.sh, 30 s each).
# Tests that cannot run here (e.g. no network namespaces in a container without root) skip, and
# are listed at the end with their reasons.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
cd build
rc=0
ctest --output-on-failure --timeout 600 -j "$(nproc)" || rc=$?
if grep -q ": Skipped$" Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "== skipped tests and why =="
  grep -A1 ": Skipped$" Testing/Temporary/LastTest.log | grep -v -e "^--$" -e ": Skipped$" | sort | uniq -c
fi
cd ..
bash scripts/test-pip.sh || rc=1
bash scripts/fuzz.sh --seconds 30 || rc=1
exit "$rc"
