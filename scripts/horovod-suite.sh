#!/usr/bin/env bash
# Horovod's own PyTorch suite (test/parallel/test_torch.py) against dtrain.torch, with 2 ranks,
# under mpirun and under `dtrain launch -s 0` (Gloo, horovodrun's variables): the check that a
# Horovod script runs unchanged. Horovod's file is downloaded at a pinned commit (or taken from
# $HOROVOD_TEST_TORCH) into a scratch folder, never into this repository; beside it go this
# script's own stand-ins: a `horovod.torch` package that re-exports dtrain.torch, and the three
# helpers test_torch.py imports from Horovod's test/utils/common.py.
#
#   bash scripts/horovod-suite.sh [mpi|gloo|both]      (default both; needs network for the file)
#
# dtrain is imported as Python finds it (an install, or PYTHONPATH=build/python). Each rank's
# report goes to the scratch folder; the summary line per launcher is printed, and the exit code
# is non-zero if a launcher had a failure or did not finish.
set -euo pipefail

which=${1:-both}
pin=2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a  # horovod/horovod master, 2026-06-20
ranks=2
repo=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${DTRAIN:-$(command -v dtrain || echo "$repo/build/src/tools/dtrain")}
python=${PYTHON:-/usr/bin/python3}
scratch=$(mktemp -d /tmp/dtrain-horovod-suite.XXXXXX)
trap 'pkill -f "$scratch/" 2>/dev/null || true' EXIT

mkdir -p "$scratch/parallel" "$scratch/utils" "$scratch/shim/horovod/torch" "$scratch/logs"
if [[ -n ${HOROVOD_TEST_TORCH:-} ]]; then
  cp "$HOROVOD_TEST_TORCH" "$scratch/parallel/test_torch.py"
else
  curl -fsSL --max-time 60 -o "$scratch/parallel/test_torch.py" \
    "https://raw.githubusercontent.com/horovod/horovod/$pin/test/parallel/test_torch.py"
fi

cat > "$scratch/shim/horovod/__init__.py" <<'EOF'
EOF
cat > "$scratch/shim/horovod/torch/__init__.py" <<'EOF'
# horovod.torch as dtrain.torch (test-only; written by dtrain's scripts/horovod-suite.sh).
import sys as _sys
import dtrain.torch as _dtrain_torch
import dtrain.torch.mpi_ops as _mpi_ops
from dtrain.torch import *  # noqa: F401,F403
for _name in dir(_dtrain_torch):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_dtrain_torch, _name)
_sys.modules["horovod.torch.mpi_ops"] = _mpi_ops
_sys.modules["horovod.torch.elastic"] = _dtrain_torch.elastic
EOF
cat > "$scratch/utils/common.py" <<'EOF'
# The three helpers test_torch.py imports from Horovod's test/utils/common.py (dtrain's own).
import contextlib, os, tempfile

def mpi_env_rank_and_size():
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1

def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)

@contextlib.contextmanager
def temppath():
    d = tempfile.TemporaryDirectory()
    try:
        yield os.path.join(d.name, "temp_test_file")
    finally:
        d.cleanup()
EOF
# One rank: its report in logs/<launcher>.<rank>.txt. pytest-timeout, where installed, turns a
# hang into a failure with every thread's stack.
timeout_flags=""
if "$python" -c "import pytest_timeout" 2>/dev/null; then
  timeout_flags="--timeout 300 --timeout-method=thread"
fi
cat > "$scratch/rank.sh" <<EOF
#!/bin/bash
r=\${OMPI_COMM_WORLD_RANK:-\${HOROVOD_RANK:-0}}
cd "$scratch" && exec "$python" -m pytest -p no:cacheprovider --color=no -q -rfEs $timeout_flags \
  parallel/test_torch.py > "logs/\$SUITE_LAUNCHER.\$r.txt" 2>&1
EOF
chmod +x "$scratch/rank.sh"
# The ranks run in the scratch folder: a relative PYTHONPATH entry (PYTHONPATH=build/python) is
# made absolute here, else they would import whatever dtrain is installed instead.
abs_pythonpath=""
IFS=: read -ra entries <<< "${PYTHONPATH:-}"
for entry in "${entries[@]}"; do
  [[ -n $entry ]] && abs_pythonpath+=":$(realpath -m "$entry")"
done
export PYTHONPATH="$scratch/shim$abs_pythonpath"

status=0
run() {  # launcher, command...
  local launcher=$1
  shift
  local start=$SECONDS
  if ! SUITE_LAUNCHER=$launcher timeout 1200 "$@" > "$scratch/logs/$launcher.launch.txt" 2>&1; then
    status=1
  fi
  local summary
  summary=$(tail -n 1 "$scratch/logs/$launcher.0.txt" 2>/dev/null || echo "no report")
  echo "horovod-suite: $launcher, $ranks ranks, $((SECONDS - start)) s: $summary"
  grep -h "^FAILED" "$scratch/logs/$launcher".*.txt 2>/dev/null | sort -u || true
  grep -qE "(^| )[0-9]+ failed|error" <<< "$summary" && status=1
  grep -qE "[0-9]+ passed" <<< "$summary" || status=1
}
mpi_root=()
[[ $(id -u) == 0 ]] && mpi_root=(--allow-run-as-root)
if [[ $which == mpi || $which == both ]]; then
  # mpirun passes on only the variables named: dtrain's and Horovod's settings as well.
  forwarded=()
  for var in $(compgen -e | grep -E '^(DTRAIN|HOROVOD)_' || true); do forwarded+=(-x "$var"); done
  run mpi mpirun "${mpi_root[@]}" --oversubscribe --bind-to none -np $ranks -x PYTHONPATH \
    -x SUITE_LAUNCHER "${forwarded[@]}" "$scratch/rank.sh"
fi
if [[ $which == gloo || $which == both ]]; then
  run gloo "$dtrain" launch -n $ranks -s 0 --launcher local -- "$scratch/rank.sh"
fi
echo "horovod-suite: reports in $scratch/logs"
exit $status
