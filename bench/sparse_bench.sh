#!/usr/bin/env bash
# examples/python/dlrm.py's model (a 1.07 GB table and two small ones, 64-dim rows, AdaGrad) on two
# workers of this machine, three ways in one run (bench/sparse_bench.py says what each is): dtrain's
# parameter server with the tables on 2 servers, PyTorch DDP over gloo, and Horovod's sparse
# allgather path on dtrain. Prints each mode's samples/s, the bytes a worker sends per step for
# the tables, peak memory per worker and held-out AUC after the same samples, and the ratios to
# DDP.
#
#   bash bench/sparse_bench.sh [--steps N] [--tables R1,R2,...]   (arguments go to each mode)
set -euo pipefail
cd "$(dirname "$0")/.."
dtrain=build/src/tools/dtrain
python=${PYTHON:-/usr/bin/python3}
export PYTHONPATH=${PYTHONPATH:-$PWD/build/python}
out=$(mktemp -d /tmp/dtrain-sparse-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
timeout 900 "$dtrain" launch -n 2 -s 2 -- "$python" bench/sparse_bench.py ps "$@" >"$out/ps" 2>&1 ||
  { tail -20 "$out/ps"; exit 1; }
timeout 900 "$python" bench/sparse_bench.py ddp "$@" >"$out/ddp" 2>&1 || { tail -20 "$out/ddp"; exit 1; }
timeout 900 "$dtrain" launch -n 2 -s 0 -- "$python" bench/sparse_bench.py hvd "$@" >"$out/hvd" 2>&1 ||
  { tail -20 "$out/hvd"; exit 1; }
"$python" - "$out" <<'PY'
import json, re, sys
rows = {}
for mode in ("ps", "ddp", "hvd"):
    text = open(f"{sys.argv[1]}/{mode}").read()
    line = [l for l in text.splitlines() if '"samples_per_s"' in l][-1]
    rows[mode] = json.loads(line[line.index("{"):])
ddp = rows["ddp"]
print("| mode | samples/s | vs DDP | table MiB sent per step a worker | vs DDP | peak RSS MiB a worker | test AUC |")
print("|---|---|---|---|---|---|---|")
for mode, r in rows.items():
    print(f"| {mode} | {r['samples_per_s']:.0f} | {r['samples_per_s'] / ddp['samples_per_s']:.1f}x "
          f"| {r['table_bytes_per_step'] / 2**20:.2f} | {ddp['table_bytes_per_step'] / r['table_bytes_per_step']:.0f}x fewer "
          f"| {r['peak_rss_mb']:.0f} | {r['test_auc']:.4f} |")
print(f"(after {ddp['samples_trained']} samples each)")
PY
