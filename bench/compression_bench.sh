#!/usr/bin/env bash
# Gradient compression over a bandwidth-capped link between two emulated hosts: two network
# namespaces joined by a veth pair, each end shaped with tc (token bucket) to the link rate.
#
# 1. Push time: one worker on host B pushes to one server on host A (the scheduler is on A too),
#    1 MB to 64 MB of float32, uncompressed and with 2bit, 1bit and fp16, at 1 Gbit/s and
#    100 Mbit/s (bench/kvstore_bench.cc --ops push). One JSON line per case: median and p90 ms,
#    the bytes one push puts on the wire, the link's bound (those bytes at the link rate) and the
#    speed-up over float32 on the same link.
# 2. Training across the link (1 Gbit/s): dtrain-train, LeNet and the MLP on Fashion-MNIST, 2
#    workers and 2 servers (worker 0, server 0 and the scheduler on A; worker 1 and server 1 on
#    B), one epoch, with each compression type: samples/s (median window, summed) and test
#    accuracy. --no-train skips it.
#
#   bash bench/compression_bench.sh                    # ~8 minutes; needs root (ip netns, tc)
#   bash bench/compression_bench.sh --rates 1gbit --no-train
#
# Everything it starts runs inside the two namespaces, which are deleted (with whatever still
# runs there) on every exit path, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
rates="1gbit 100mbit"
train=1
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --no-train) train=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compression_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "compression_bench: needs root for ip netns and tc" >&2; exit 2; }
dtrain=$PWD/$build/src/tools/dtrain
bench=$PWD/$build/bench/kvstore_bench
trainer=$PWD/$build/src/train/dtrain-train
for bin in "$dtrain" "$bench" "$trainer"; do
  [[ -x $bin ]] || { echo "compression_bench: $bin is missing: bash scripts/build.sh" >&2; exit 2; }
done

source "scripts/netns.sh"
make_host_pair gc 77 compression_bench ||
  { echo "compression_bench: cannot make network namespaces joined by a veth pair here" >&2; exit 1; }

# in NS HOST ROLE RANK LOG CMD...: a job process in namespace NS, announcing HOST, in the
# background.
job_env=()
in_ns() {
  local ns=$1 host=$2 role=$3 rank=$4 log=$5
  shift 5
  ip netns exec "$ns" env "${job_env[@]}" DMLC_ROLE="$role" DMLC_NODE_HOST="$host" \
    DTRAIN_NODE_RANK="$rank" OMP_NUM_THREADS=1 "$@" >"$log" 2>&1 &
}
wait_all() {  # PIDS...: every one must exit 0 within 10 minutes
  local rc=0
  for pid in "$@"; do wait "$pid" || rc=1; done
  return $rc
}

for rate in $rates; do
  shape_host_pair "$rate"
  declare -A fp32_ms=()
  for gc in none 2bit 1bit fp16; do
    job_env=(DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$((20000 + RANDOM % 20000))
             DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1)
    in_ns "$a" "$addr_a" scheduler 0 "$logs/sched.log" "$dtrain" scheduler; s1=$!
    in_ns "$a" "$addr_a" server 0 "$logs/server.log" "$dtrain" server; s2=$!
    in_ns "$b" "$addr_b" worker 0 "$logs/worker.log" timeout 600 "$bench" --ops push \
      --bytes 1048576,16777216,67108864 --seconds 2 --gc-type "$gc"; w=$!
    wait_all "$w" "$s1" "$s2" || { echo "compression_bench: push job failed:" >&2; tail "$logs"/*.log >&2; exit 1; }
    while read -r line; do
      bytes=$(sed 's/.*"bytes":\([0-9]*\).*/\1/' <<<"$line")
      ms=$(sed 's/.*"median_ms":\([0-9.e-]*\).*/\1/' <<<"$line")
      wire=$(sed 's/.*"push_wire_bytes":\([0-9]*\).*/\1/' <<<"$line")
      [[ $gc == none ]] && fp32_ms[$bytes]=$ms
      bound=$(awk -v w="$wire" -v m="$(link_mbit "$rate")" 'BEGIN { printf "%.3f", w * 8 / (m * 1e6) * 1e3 }')
      speedup=$(awk -v f="${fp32_ms[$bytes]}" -v m="$ms" 'BEGIN { printf "%.2f", f / m }')
      echo "${line%\}},\"link_mbit\":$(link_mbit "$rate"),\"link_bound_ms\":$bound,\"speedup_vs_float32\":$speedup}"
    done < <(grep '^{' "$logs/worker.log")
  done
  unset fp32_ms
done

((train)) || exit 0
shape_host_pair 1gbit
for net in lenet mlp; do
  for gc in none 2bit 1bit fp16; do
    job_env=(DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$((20000 + RANDOM % 20000))
             DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2)
    args=(--dataset fashion-mnist --network "$net" --epochs 1 --log-interval 200 --threads 1
          --kvstore dist_sync --gc-type "$gc")
    in_ns "$a" "$addr_a" scheduler 0 "$logs/sched.log" "$dtrain" scheduler; p1=$!
    in_ns "$a" "$addr_a" server 0 "$logs/s0.log" "$dtrain" server; p2=$!
    in_ns "$b" "$addr_b" server 1 "$logs/s1.log" "$dtrain" server; p3=$!
    in_ns "$a" "$addr_a" worker 0 "$logs/w0.log" timeout 900 "$trainer" "${args[@]}"; p4=$!
    in_ns "$b" "$addr_b" worker 1 "$logs/w1.log" timeout 900 "$trainer" "${args[@]}"; p5=$!
    wait_all "$p4" "$p5" "$p1" "$p2" "$p3" ||
      { echo "compression_bench: training failed:" >&2; tail "$logs"/*.log >&2; exit 1; }
    speed=$(python3 -c '
import re, statistics, sys
total = 0.0
for path in sys.argv[1:]:  # per worker: the median window after the first
    v = [float(x) for x in re.findall(r"Speed: ([0-9.]+) samples/sec", open(path).read())][1:]
    total += statistics.median(v) if v else 0
print("%.1f" % total)' "$logs/w0.log" "$logs/w1.log")
    acc=$(grep -o 'Test_acc [0-9.]*' "$logs/w0.log" | tail -1 | cut -d' ' -f2)
    printf '{"bench":"compression_train","network":"%s","gc_type":"%s","workers":2,"servers":2,"link_mbit":1000,"epochs":1,"samples_per_s":%s,"test_acc":%s}\n' \
      "$net" "$gc" "$speed" "${acc:-null}"
  done
done
