#!/usr/bin/env bash
# dtrain.torch's allreduce, allgather, alltoall and reducescatter (Horovod's API over dtrain's
# Gloo backend) against PyTorch's torch.distributed gloo collectives of the same size, float32,
# 2 ranks on this machine, both in the same processes and run (bench/hvd_collectives_bench.py).
# One JSON line per (op, size): median milliseconds of each, speedup = torch / dtrain (target:
# >= 1.0 at every size), and the time of one memcpy of the tensor (the physical floor).
#
#   bash bench/hvd_collectives_bench.sh                    # 1, 4, 16, 64 MB; ~1-2 minutes
#   bash bench/hvd_collectives_bench.sh --sizes-mb 1,4 --iterations 5
#   bash bench/hvd_collectives_bench.sh --ops allreduce,adasum     # Adasum beside the sum
#   bash bench/hvd_collectives_bench.sh --venv build/venv/torch2   # PyPI's torch 2, pip-installed
#
# Needs the project built (scripts/build.sh) with Debian's python3-torch, or --venv with dtrain
# pip-installed there.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
python=${PYTHON:-/usr/bin/python3}
ranks=2
args=()
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --venv) python=$2/bin/python; launcher=$2/bin/dtrain; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --sizes-mb|--iterations|--ops) args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hvd_collectives_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
launcher=${launcher:-$build/src/tools/dtrain}
[[ $launcher == "$build"/* ]] && export PYTHONPATH=$PWD/$build/python
[[ -x $launcher ]] || { echo "hvd_collectives_bench: $launcher is missing: bash scripts/build.sh" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 900 "$launcher" launch -n "$ranks" -s 0 -- \
  "$python" bench/hvd_collectives_bench.py --torch-port "$port" "${args[@]}" |
  grep '^\[worker 0\] {' | sed 's/^\[worker 0\] //'
