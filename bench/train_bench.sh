#!/usr/bin/env bash
# Training throughput of dtrain-train against PyTorch DistributedDataParallel (gloo, CPU; Debian's
# python3-torch) for the same network, per-process batch, threads and samples, side by side:
# LeNet and the MLP (784-512-512-10) on Fashion-MNIST, SGD lr 0.05 momentum 0.9, 1 worker (1 and 2
# threads, dtrain with --kvstore local) and 2 workers (1 thread each; dtrain through
# `dtrain launch -n 2 -s 2 --kvstore dist_sync`). Both use LibTorch for the arithmetic.
#
# Prints one JSON line per case with dtrain's and DDP's aggregate samples/s and their ratio, then one
# line per network with the 2-core ceiling (the best single process on both cores: max of dtrain and
# DDP with 1 worker and 2 threads, measured in the same run) and dtrain's 2-worker ratio to it
# against the bar (0.95 for LeNet, 0.9 for the MLP). Every line carries the 1-minute load average
# taken just before the case: on a shared machine, compare only runs taken under similar load.
# A LibTorch process with 2 threads collapses (10-50x slower) as soon as anything else wants a
# core, so "ceiling_suspect": true (2 threads slower than 1) means the run was disturbed.
#
# samples/s: dtrain prints `Epoch[0] Batch [a-b] Speed: X samples/sec` every --log-interval steps
# per worker; a worker's speed is the median of its windows after the first (warm-up), the
# aggregate is the sum over workers. bench/ddp_train.py times the same windows the same way. With
# --repeat R every measurement runs R times (dtrain and DDP alternating) and the best is kept.
#
#   bash bench/train_bench.sh                          # everything, ~2-4 minutes on 2 idle cores
#   bash bench/train_bench.sh --build build-bench --networks lenet --repeat 1
#
# The environment reaches every process, e.g. DTRAIN_IO_THREADS=1 DTRAIN_STREAMS_PER_PEER=1.
#
# Needs the project built (default ./build; --build DIR for another build directory) and
# python3-torch: bash scripts/install-deps.sh --bench
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
networks="lenet mlp"
batch=64
samples=20000      # training samples per run (all workers together), as --limit-train
log_interval=20    # steps per timing window
repeat=2
keep_logs=""
python=${PYTHON:-/usr/bin/python3}  # Debian's torch lives in the system python, not pyenv's

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --networks) networks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --log-interval) log_interval=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --keep-logs) keep_logs=$2; shift 2 ;;
    -h|--help) usage; echo "options: --build DIR --networks 'lenet mlp' --batch 64 --samples 20000" \
                 "--log-interval 20 --repeat 2 --keep-logs DIR"; exit 0 ;;
    *) echo "train_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done

# Every worker of the 2-worker case needs a warm-up window and at least one measured window.
if ((samples / 2 / batch < 2 * log_interval)); then
  echo "train_bench: --samples $samples gives each of 2 workers $((samples / 2 / batch)) steps of" \
    "$batch, fewer than 2 windows of --log-interval $log_interval" >&2
  exit 2
fi

train=$build/src/train/dtrain-train
launcher=$build/src/tools/dtrain
for bin in "$train" "$launcher"; do
  if [[ ! -x $bin ]]; then
    echo "train_bench: $bin is missing: build it (bash scripts/build.sh, or --build DIR)" >&2
    exit 2
  fi
done
if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
  echo "train_bench: $python cannot import torch: bash scripts/install-deps.sh --bench" >&2
  exit 2
fi

if [[ -n $keep_logs ]]; then
  mkdir -p "$keep_logs"; logs=$keep_logs
else
  logs=$(mktemp -d /tmp/train_bench.XXXXXX); trap 'rm -rf "$logs"' EXIT
fi
export OPENBLAS_NUM_THREADS=1

load1() { cut -d' ' -f1 /proc/loadavg; }

# Aggregate samples/s from dtrain-train's output (plain, or prefixed `[worker N] ` by the
# launcher): per worker the median of its Speed windows after the first, summed over workers.
dtrain_speed() {
  awk '
    /Speed: [0-9.]+ samples\/sec/ {
      w = ($1 ~ /^\[worker$/) ? $2 : "0]"
      for (i = 1; i <= NF; i++) if ($i == "Speed:") s = $(i + 1)
      n[w]++
      if (n[w] > 1) { v[w, n[w] - 1] = s; m[w] = n[w] - 1 }
    }
    END {
      total = 0; workers = 0
      for (w in n) {
        k = m[w]; if (k == 0) continue
        for (i = 1; i <= k; i++) a[i] = v[w, i]
        for (i = 2; i <= k; i++) { x = a[i]; j = i - 1; while (j > 0 && a[j] > x) { a[j + 1] = a[j]; j-- }; a[j + 1] = x }
        med = (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        total += med; workers++
      }
      if (workers == 0) exit 1
      printf "%.1f\n", total
    }' "$1"
}

# run_dtrain NETWORK WORKERS THREADS LOG: prints aggregate samples/s.
run_dtrain() {
  local net=$1 workers=$2 threads=$3 log=$4
  local args=(--dataset fashion-mnist --network "$net" --epochs 1 --batch-size "$batch"
              --limit-train "$samples" --log-interval "$log_interval" --optimizer sgd --lr 0.05
              --momentum 0.9 --threads "$threads")
  if ((workers == 1)); then
    timeout 300 "$train" "${args[@]}" --kvstore local >"$log" 2>&1
  else
    timeout 300 "$launcher" launch -n "$workers" -s "$workers" --launcher local -- \
      "$train" "${args[@]}" --kvstore dist_sync >"$log" 2>&1
  fi || { echo "train_bench: dtrain-train failed, see $log:" >&2; tail -5 "$log" >&2; return 1; }
  dtrain_speed "$log" || { echo "train_bench: no Speed lines after warm-up in $log" >&2; return 1; }
}

# run_ddp NETWORK WORKERS THREADS LOG: prints aggregate samples/s.
run_ddp() {
  local net=$1 workers=$2 threads=$3 log=$4
  timeout 300 "$python" bench/ddp_train.py --network "$net" --workers "$workers" \
    --batch-size "$batch" --threads "$threads" --limit-train "$samples" \
    --log-interval "$log_interval" >"$log" 2>&1 ||
    { echo "train_bench: ddp_train.py failed, see $log:" >&2; tail -5 "$log" >&2; return 1; }
  grep '^{' "$log" | tail -1 | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/'
}

max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.3f\n", a / b; else print "null" }'; }

for net in $networks; do
  declare -A dtrain_best=() ddp_best=()
  for case in "1 1" "1 2" "2 1"; do
    read -r workers threads <<<"$case"
    load_before=$(load1)
    d=0; p=0
    for ((r = 1; r <= repeat; r++)); do
      tag=$net-w$workers-t$threads-r$r
      s=$(run_dtrain "$net" "$workers" "$threads" "$logs/dtrain-$tag.log") || exit 1
      d=$(max "$d" "$s")
      s=$(run_ddp "$net" "$workers" "$threads" "$logs/ddp-$tag.log") || exit 1
      p=$(max "$p" "$s")
    done
    dtrain_best[$case]=$d; ddp_best[$case]=$p
    # The threads dtrain-train actually used, from its "worker 0 of N: ... K thread(s)" line.
    used=$(grep -ho '[0-9]* thread(s)' "$logs/dtrain-$tag.log" | head -1 | cut -d' ' -f1)
    printf '{"bench":"train","network":"%s","workers":%d,"batch":%d,"threads_per_process":%d,"dtrain_threads_seen":%s,"samples":%d,"dtrain_samples_per_s":%s,"ddp_samples_per_s":%s,"ratio_dtrain_vs_ddp":%s,"repeat":%d,"load1_before":%s,"load1_after":%s}\n' \
      "$net" "$workers" "$batch" "$threads" "${used:-null}" "$samples" "$d" "$p" "$(ratio "$d" "$p")" \
      "$repeat" "$load_before" "$(load1)"
  done
  ceiling=$(max "${dtrain_best[1 2]}" "${ddp_best[1 2]}")
  ceiling_from="dtrain"
  awk -v a="${dtrain_best[1 2]}" -v b="${ddp_best[1 2]}" 'BEGIN { exit !(b + 0 > a + 0) }' &&
    ceiling_from="ddp"
  # One process on both cores should not be slower than on one: if it is, something else was
  # running (a 2-thread OpenMP team collapses when a core is taken) and the ceiling is too low.
  one_thread_best=$(max "${dtrain_best[1 1]}" "${ddp_best[1 1]}")
  suspect=$(awk -v c="$ceiling" -v o="$one_thread_best" 'BEGIN { print (c + 0 < o + 0) ? "true" : "false" }')
  bar=0.95; [[ $net == mlp ]] && bar=0.9
  r2=$(ratio "${dtrain_best[2 1]}" "$ceiling")
  printf '{"bench":"train_ceiling","network":"%s","batch":%d,"cores":%d,"ceiling_samples_per_s":%s,"ceiling_from":"%s 1 process x 2 threads","ceiling_suspect":%s,"dtrain_2workers_samples_per_s":%s,"ratio_2workers_vs_ceiling":%s,"ddp_2workers_samples_per_s":%s,"ddp_ratio_2workers_vs_ceiling":%s,"bar":%s,"meets_bar":%s,"load1":%s}\n' \
    "$net" "$batch" "$(nproc)" "$ceiling" "$ceiling_from" "$suspect" "${dtrain_best[2 1]}" "$r2" \
    "${ddp_best[2 1]}" "$(ratio "${ddp_best[2 1]}" "$ceiling")" "$bar" \
    "$(awk -v r="$r2" -v b="$bar" 'BEGIN { print (r != "null" && r + 0 >= b + 0) ? "true" : "false" }')" \
    "$(load1)"
  unset dtrain_best ddp_best
done
