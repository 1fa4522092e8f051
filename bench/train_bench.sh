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
# Allreduce mode: per network, the same 2-worker run (1 thread each, same batch and samples) with
# --kvstore horovod, no servers, over Gloo (`dtrain launch -n 2 -s 0`) and over OpenMPI (`mpirun -np
# 2 --oversubscribe --bind-to none`; shared memory through CMA where the container allows it, else
# OMPI_MCA_btl_vader_single_copy_mechanism=none, probed first). One "train_allreduce" JSON line
# per network gives dist_sync, horovod-gloo, horovod-mpi and DDP samples/s with 2 workers and the
# ratios horovod/dist_sync and horovod/DDP (dist_sync and DDP are the "workers":2 case above);
# a table of them ends the output. --no-allreduce skips these runs; without mpirun the MPI
# figures are null.
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
# python3-torch (bash scripts/install-deps.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
networks="lenet mlp"
batch=64
samples=20000      # training samples per run (all workers together), as --limit-train
log_interval=20    # steps per timing window
repeat=2
keep_logs=""
allreduce=1
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
    --no-allreduce) allreduce=0; shift ;;
    -h|--help) usage; echo "options: --build DIR --networks 'lenet mlp' --batch 64 --samples 20000" \
                 "--log-interval 20 --repeat 2 --keep-logs DIR --no-allreduce"; exit 0 ;;
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
  echo "train_bench: $python cannot import torch: bash scripts/install-deps.sh" >&2
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

# run_horovod NETWORK gloo|mpi LOG: the 2-worker allreduce run (--kvstore horovod, 1 thread per
# worker, otherwise as dist_sync); prints aggregate samples/s. mpirun's --tag-output prefixes
# `[1,N]<stdout>:` become the launcher's `[worker N] ` for dtrain_speed.
run_horovod() {
  local net=$1 backend=$2 log=$3
  local args=(--dataset fashion-mnist --network "$net" --epochs 1 --batch-size "$batch"
              --limit-train "$samples" --log-interval "$log_interval" --optimizer sgd --lr 0.05
              --momentum 0.9 --threads 1 --kvstore horovod)
  if [[ $backend == gloo ]]; then
    timeout 300 "$launcher" launch -n 2 -s 0 --launcher local -- "$train" "${args[@]}" >"$log" 2>&1
  else
    timeout 300 mpirun "${mpirun_args[@]}" "$train" "${args[@]}" >"$log.raw" 2>&1 &&
      sed -E 's/^\[[0-9]+,([0-9]+)\]<std(out|err)>: ?/[worker \1] /' "$log.raw" >"$log"
  fi || { echo "train_bench: horovod-$backend failed, see $log:" >&2; tail -5 "$log"* >&2; return 1; }
  dtrain_speed "$log" || { echo "train_bench: no Speed lines after warm-up in $log" >&2; return 1; }
}

max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.3f\n", a / b; else print "null" }'; }

# OpenMPI: as bench/allreduce_bench.sh, probe whether vader's single-copy (CMA, needs ptrace) works
# here with a short horovod run (gradients are far above the eager limit); if not, turn it off.
have_mpi=0; mpi_single_copy=null
if ((allreduce)) && command -v mpirun >/dev/null; then
  have_mpi=1
  mpirun_args=(-np 2 --oversubscribe --bind-to none --tag-output)
  ((EUID == 0)) && mpirun_args+=(--allow-run-as-root)
  probe=(--dataset fashion-mnist --network lenet --epochs 1 --batch-size 32 --limit-train 256
         --log-interval 1000 --threads 1 --kvstore horovod)
  if timeout 120 mpirun "${mpirun_args[@]}" "$train" "${probe[@]}" >"$logs/mpi-probe.log" 2>&1; then
    mpi_single_copy='"default"'
  else
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    timeout 120 mpirun "${mpirun_args[@]}" "$train" "${probe[@]}" >"$logs/mpi-probe.log" 2>&1 ||
      { echo "train_bench: mpirun dtrain-train --kvstore horovod fails, see $logs/mpi-probe.log:" >&2
        tail -5 "$logs/mpi-probe.log" >&2; exit 1; }
    mpi_single_copy='"none"'
  fi
elif ((allreduce)); then
  echo "train_bench: no mpirun, the horovod-mpi figures will be null" >&2
fi
summary=()

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
  if ((allreduce)); then
    load_before=$(load1)
    hg=0; hm=0
    for ((r = 1; r <= repeat; r++)); do
      s=$(run_horovod "$net" gloo "$logs/horovod-gloo-$net-w2-t1-r$r.log") || exit 1
      hg=$(max "$hg" "$s")
      if ((have_mpi)); then
        s=$(run_horovod "$net" mpi "$logs/horovod-mpi-$net-w2-t1-r$r.log") || exit 1
        hm=$(max "$hm" "$s")
      fi
    done
    ((have_mpi)) || hm=null
    ds=${dtrain_best[2 1]}; dp=${ddp_best[2 1]}
    printf '{"bench":"train_allreduce","network":"%s","workers":2,"batch":%d,"threads_per_process":1,"samples":%d,"dist_sync_samples_per_s":%s,"horovod_gloo_samples_per_s":%s,"horovod_mpi_samples_per_s":%s,"ddp_samples_per_s":%s,"ratio_horovod_gloo_vs_dist_sync":%s,"ratio_horovod_mpi_vs_dist_sync":%s,"ratio_horovod_gloo_vs_ddp":%s,"ratio_horovod_mpi_vs_ddp":%s,"mpi_single_copy":%s,"repeat":%d,"load1_before":%s,"load1_after":%s}\n' \
      "$net" "$batch" "$samples" "$ds" "$hg" "$hm" "$dp" "$(ratio "$hg" "$ds")" "$(ratio "$hm" "$ds")" \
      "$(ratio "$hg" "$dp")" "$(ratio "$hm" "$dp")" "$mpi_single_copy" "$repeat" "$load_before" "$(load1)"
    summary+=("$(printf '%-6s %10s %12s %11s %10s %10s %9s %10s %9s' "$net" "$ds" "$hg" "$hm" "$dp" \
      "$(ratio "$hg" "$ds")" "$(ratio "$hm" "$ds")" "$(ratio "$hg" "$dp")" "$(ratio "$hm" "$dp")")")
  fi
  unset dtrain_best ddp_best
done

if ((allreduce)); then
  echo
  echo "2 workers x 1 thread, batch $batch, $samples samples, samples/s (best of $repeat), load1 now $(load1):"
  printf '%-6s %10s %12s %11s %10s %10s %9s %10s %9s\n' network dist_sync horovod-gloo horovod-mpi \
    ddp gloo/dsync mpi/dsync gloo/ddp mpi/ddp
  printf '%s\n' "${summary[@]}"
fi
