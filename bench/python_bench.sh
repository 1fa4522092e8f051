#!/usr/bin/env bash
# dtrain's Python API (import dtrain) measured against the peers a PyTorch user would pick, in
# one run, 2 workers x 1 thread on this machine:
#
# 1. Training throughput, LeNet and the 784-512-512-10 MLP on Fashion-MNIST, batch 64 per
#    worker, SGD lr 0.05 momentum 0.9, all 60,000 training samples (--samples; bench/python_train.py:
#    the same data, batches and timing windows as bench/ddp_train.py):
#      trainer      dtrain.torch.Trainer over dist_sync, 2 servers (dtrain launch -n 2 -s 2)
#      hvd_gloo     dtrain.torch.DistributedOptimizer over Gloo (dtrain launch -n 2 -s 0)
#      hvd_mpi      the same over OpenMPI (mpirun -np 2)
#      ddp          PyTorch DistributedDataParallel, gloo (bench/ddp_train.py), as users run it
#      ddp_kept     the same with the heap setting dtrain's workers apply (DTRAIN_KEEP_FREED_MB:
#                   freed memory stays in the heap), given to DDP through GLIBC_TUNABLES: the
#                   like-for-like comparison of the distributed part alone
#      bound        the same loop and heap setting with no communication at all (ddp_train.py
#                   --independent): what no data-parallel trainer on this machine can beat
#      dtrain_train the C++ front end, dist_sync, 2 servers (dtrain-train), for reference
#    samples/s: per worker the median timing window after the first, summed over workers; best
#    of --repeat runs. One JSON line per network with every figure and the ratios to DDP
#    (target: trainer / ddp >= 1.2), to ddp_kept and to the bound.
# 2. What Python adds to a call: the median time of a 4 KB pushpull (call to end of wait) from
#    Python (bench/python_kv_latency.py) and from C++ (kvstore_bench), on a local store (the
#    Python layer alone) and on dist_sync 1 worker x 1 server, alternated 5 times, the median of
#    the medians (target: python - cpp < 20 us).
#
#   bash bench/python_bench.sh                     # ~3-5 minutes on 2 idle cores
#   bash bench/python_bench.sh --networks lenet --repeat 1
#   bash bench/python_bench.sh --venv build/venv/torch2   # dtrain pip-installed in that venv
#                                                          # (PyPI's torch 2: DDP is that torch's)
#
# Needs the project built (scripts/install.sh or scripts/build.sh; kvstore_bench comes from it)
# and Debian's python3-torch, or, with --venv, a venv where dtrain is pip-installed.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
networks="lenet mlp"
batch=64
samples=60000
log_interval=20
repeat=2
python=${PYTHON:-/usr/bin/python3}
venv=""
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --networks) networks=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "python_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
launcher=$build/src/tools/dtrain
train=$build/src/train/dtrain-train
export PYTHONPATH=$PWD/$build/python
if [[ -n $venv ]]; then  # the venv's own dtrain (its commands and package), nothing from build/
  python=$venv/bin/python launcher=$venv/bin/dtrain train=$venv/bin/dtrain-train PYTHONPATH=""
fi
for bin in "$launcher" "$build/bench/kvstore_bench" "$train" "$python"; do
  [[ -x $bin ]] || { echo "python_bench: $bin is missing: bash scripts/build.sh (or pip install)" >&2; exit 2; }
done
torch_version=$("$python" -c 'import torch; print(torch.__version__)')
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
logs=$(mktemp -d /tmp/python_bench.XXXXXX)
trap 'rm -rf "$logs"' EXIT
mpirun_args=(-np 2 --oversubscribe --bind-to none -x PYTHONPATH -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
((EUID == 0)) && mpirun_args+=(--allow-run-as-root)

load1() { cut -d' ' -f1 /proc/loadavg; }
# What DTRAIN_KEEP_FREED_MB's default does in dtrain's workers (common/malloc_tuning.h), in
# glibc's own variable, for the processes that do not load dtrain.
kept_heap=glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432
# Sum over ranks of "median_window" in the JSON lines of a log.
sum_ranks() {
  "$python" -c '
import re, sys
# Two ranks print to one stream (mpirun): their lines may run together, so match the fields.
rows = re.findall(r"\"rank\": (\d+), \"median_window\": ([0-9.e+-]+)", open(sys.argv[1]).read())
print("%.1f" % sum(float(v) for _, v in rows) if len(rows) == 2 else "null")' "$1"
}
# dtrain-train's progress lines: per worker the median Speed window after the first, summed.
cpp_speed() {
  "$python" -c '
import re, statistics, sys
per = {}
for line in open(sys.argv[1]):
    m = re.match(r"\[worker (\d+)\].*Speed: ([0-9.]+) samples/sec", line)
    if m:
        per.setdefault(m.group(1), []).append(float(m.group(2)))
print("%.1f" % sum(statistics.median(v[1:]) for v in per.values() if len(v) > 1) if per else "null")' "$1"
}
best() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null") print b; else if (b == "null") print a; else print (a + 0 > b + 0) ? a : b }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "null" && b + 0 > 0) printf "%.3f\n", a / b; else print "null" }'; }
fail() { echo "python_bench: $1 failed, see below:" >&2; tail -15 "$2" >&2; exit 1; }

train_args() { echo --network "$1" --batch-size "$batch" --limit-train "$samples" --log-interval "$log_interval"; }

run_case() {  # CASE NETWORK LOG -> samples/s
  local case=$1 net=$2 log=$3
  case $case in
    trainer) timeout 300 "$launcher" launch -n 2 -s 2 -- "$python" bench/python_train.py trainer $(train_args "$net") ;;
    hvd_gloo) timeout 300 "$launcher" launch -n 2 -s 0 -- "$python" bench/python_train.py hvd $(train_args "$net") ;;
    hvd_mpi) timeout 300 mpirun "${mpirun_args[@]}" "$python" bench/python_train.py hvd $(train_args "$net") ;;
    ddp) timeout 300 "$python" bench/ddp_train.py --workers 2 --threads 1 $(train_args "$net") ;;
    ddp_kept) GLIBC_TUNABLES=$kept_heap timeout 300 "$python" bench/ddp_train.py --workers 2 \
        --threads 1 $(train_args "$net") ;;
    bound) GLIBC_TUNABLES=$kept_heap timeout 300 "$python" bench/ddp_train.py --independent \
        --workers 2 --threads 1 $(train_args "$net") ;;
    dtrain_train) timeout 300 "$launcher" launch -n 2 -s 2 -- "$train" \
        --dataset fashion-mnist --network "$net" --epochs 1 --batch-size "$batch" \
        --limit-train "$samples" --log-interval "$log_interval" --optimizer sgd --lr 0.05 \
        --momentum 0.9 --threads 1 --kvstore dist_sync ;;
  esac >"$log" 2>&1 || fail "$case $net" "$log"
  case $case in
    ddp | ddp_kept | bound) grep '^{' "$log" | tail -1 | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/' ;;
    dtrain_train) cpp_speed "$log" ;;
    *) sum_ranks "$log" ;;
  esac
}

for net in $networks; do
  declare -A fig=()
  load_before=$(load1)
  for ((r = 1; r <= repeat; r++)); do
    for case in trainer hvd_gloo hvd_mpi ddp ddp_kept bound dtrain_train; do
      fig[$case]=$(best "${fig[$case]:-null}" "$(run_case "$case" "$net" "$logs/$case-$net-$r.log")")
    done
  done
  printf '{"bench":"python_train","torch":"%s","network":"%s","workers":2,"threads_per_process":1,"batch":%d,"samples":%d,"trainer_samples_per_s":%s,"hvd_gloo_samples_per_s":%s,"hvd_mpi_samples_per_s":%s,"ddp_samples_per_s":%s,"ddp_kept_heap_samples_per_s":%s,"bound_no_communication_samples_per_s":%s,"dtrain_train_cpp_samples_per_s":%s,"ratio_trainer_vs_ddp":%s,"ratio_trainer_vs_ddp_kept_heap":%s,"ratio_trainer_vs_bound":%s,"ratio_hvd_gloo_vs_ddp":%s,"ratio_hvd_mpi_vs_ddp":%s,"ratio_trainer_vs_cpp":%s,"repeat":%d,"load1_before":%s,"load1_after":%s}\n' \
    "$torch_version" "$net" "$batch" "$samples" "${fig[trainer]}" "${fig[hvd_gloo]}" "${fig[hvd_mpi]}" "${fig[ddp]}" \
    "${fig[ddp_kept]}" "${fig[bound]}" "${fig[dtrain_train]}" "$(ratio "${fig[trainer]}" "${fig[ddp]}")" \
    "$(ratio "${fig[trainer]}" "${fig[ddp_kept]}")" "$(ratio "${fig[trainer]}" "${fig[bound]}")" "$(ratio "${fig[hvd_gloo]}" "${fig[ddp]}")" \
    "$(ratio "${fig[hvd_mpi]}" "${fig[ddp]}")" "$(ratio "${fig[trainer]}" "${fig[dtrain_train]}")" \
    "$repeat" "$load_before" "$(load1)"
  unset fig
done

# What Python adds to a 4 KB pushpull: local store (no network: the Python layer and the binding
# alone) and dist_sync 1 worker x 1 server (the same plus wake-ups, which vary by tens of us from
# run to run on 2 cores); Python and C++ alternate 5 times, the median of each side's medians.
median_of() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for store in local dist_sync; do
  py=(); cpp=()
  for ((r = 1; r <= 5; r++)); do
    if [[ $store == local ]]; then
      "$python" bench/python_kv_latency.py --kvstore local >"$logs/py.log" 2>&1 || fail python_kv_latency "$logs/py.log"
      "$build/bench/kvstore_bench" --kvstore local --ops pushpull --bytes 4096 --seconds 1 >"$logs/cpp.log" 2>&1 ||
        fail kvstore_bench "$logs/cpp.log"
    else
      "$launcher" launch -n 1 -s 1 -- "$python" bench/python_kv_latency.py >"$logs/py.log" 2>&1 ||
        fail python_kv_latency "$logs/py.log"
      "$launcher" launch -n 1 -s 1 -- "$build/bench/kvstore_bench" --ops pushpull --bytes 4096 --seconds 1 \
        >"$logs/cpp.log" 2>&1 || fail kvstore_bench "$logs/cpp.log"
    fi
    py+=("$(grep -o '"median_ms":[0-9.e-]*' "$logs/py.log" | cut -d: -f2)")
    cpp+=("$(grep -o '"median_ms":[0-9.e-]*' "$logs/cpp.log" | cut -d: -f2)")
  done
  p=$(median_of "${py[@]}"); c=$(median_of "${cpp[@]}")
  printf '{"bench":"python_call_overhead","op":"pushpull","bytes":4096,"kvstore":"%s","python_median_us":%.1f,"cpp_median_us":%.1f,"python_adds_us":%.1f,"target_us":20,"runs":5,"load1":%s}\n' \
    "$store" "$(awk -v v="$p" 'BEGIN { print v * 1000 }')" "$(awk -v v="$c" 'BEGIN { print v * 1000 }')" \
    "$(awk -v a="$p" -v b="$c" 'BEGIN { print (a - b) * 1000 }')" "$(load1)"
done
