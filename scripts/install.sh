#!/usr/bin/env bash
# Sets dtrain up on this machine: the Debian packages it needs, a Release build, and
# `cmake --install` into /usr/local (or $DTRAIN_PREFIX):
#   - the dtrain and dtrain-train commands on PATH;
#   - the C++ headers (include/dtrain/...), libraries and CMake package (find_package(dtrain));
#   - the Python package, in Debian's python3 (`import dtrain`).
# `install.sh [run]` installs and builds only what running needs (scripts/run-main-job.sh);
# `install.sh test` also the tests' packages and the tests, benchmarks and examples
# (scripts/test.sh). Both install into the same places, and each phase's time is printed.
# When `python3` on PATH is another interpreter of the same Python version (pyenv, say), which
# cannot see Debian's torch, a .pth file in its site-packages adds Debian's dist-packages folders
# to its path, so that `python3 -c "import dtrain"` works there too.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phases.sh
what=${1:-run}
[[ $what == run || $what == test ]] || { echo "install: unknown set '$what' (run, test)" >&2; exit 2; }
prefix=${DTRAIN_PREFIX:-/usr/local}
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

phase "packages ($what)" bash scripts/install-deps.sh "$what"
if [[ $what == test ]]; then bash scripts/build.sh all; else bash scripts/build.sh run; fi
phase "install" $SUDO cmake --install build --prefix "$prefix" >/dev/null
echo "install: dtrain installed under $prefix"

system_python=/usr/bin/python3
site=$("$system_python" -c 'import sys; print("%s/lib/python%d.%d/dist-packages" % ((sys.argv[1],) + sys.version_info[:2]))' "$prefix")
path_python=$(command -v python3 || true)
if [[ -n "$path_python" ]] && ! (cd / && env -u PYTHONPATH python3 -c 'import dtrain' 2>/dev/null); then
  same_version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  system_version=$("$system_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [[ "$same_version" == "$system_version" ]]; then
    target=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    printf '%s\n/usr/lib/python3/dist-packages\n' "$site" | $SUDO tee "$target/dtrain-debian-packages.pth" >/dev/null
    echo "install: python3 on PATH ($path_python, Python $same_version) now also finds $site and Debian's torch ($target/dtrain-debian-packages.pth)"
  else
    echo "install: warning: python3 on PATH is Python $same_version, dtrain is built for Debian's Python $system_version: use $system_python" >&2
  fi
fi

# What a user does next, in a fresh environment.
(cd / && env -u PYTHONPATH "$system_python" -c 'import dtrain') ||
  { echo "install: $system_python cannot import dtrain" >&2; exit 1; }
if [[ "$prefix" == /usr/local ]]; then
  command -v dtrain >/dev/null || { echo "install: dtrain is not on PATH" >&2; exit 1; }
fi
phase_summary
