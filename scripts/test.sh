#!/usr/bin/env bash
# Sets up (installs, `scripts/install.sh test`: the tests' packages too, and the tests, benchmarks
# and examples built), then runs every test with ctest: the C++ suites, the Python package's pytest
# files, and the check of the installed package from outside the tree; then `pip install` into
# virtual environments with PyPI's torch 2 and with Debian's torch (scripts/test-pip.sh: the Python
# suite again on the pip-installed package, and a wheel); then a short run of each fuzzer
# (scripts/fuzz.sh, 30 s each). Each phase's time is printed at the end.
# Tests that cannot run here (e.g. no network namespaces in a container without root) skip, and
# are listed at the end with their reasons.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phases.sh
bash scripts/install.sh test
rc=0
(cd build && phase "ctest" ctest --output-on-failure --timeout 600 -j "$(nproc)") || rc=$?
if grep -q ": Skipped$" build/Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "== skipped tests and why =="
  grep -A1 ": Skipped$" build/Testing/Temporary/LastTest.log | grep -v -e "^--$" -e ": Skipped$" | sort | uniq -c
fi
phase "pip (torch 2, Debian's torch)" bash scripts/test-pip.sh || rc=1
phase "fuzzers" bash scripts/fuzz.sh --seconds 30 || rc=1
phase_summary
exit "$rc"
