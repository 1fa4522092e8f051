#!/usr/bin/env bash
# Send buffers across a link: one worker on host B pushpulls 1, 16 and 64 MB to one server on
# host A (two network namespaces joined by a veth pair, both directions shaped with tc's token
# bucket to RATE, or unshaped: `none`), for each DTRAIN_TCP_SNDBUF setting: auto (dtrain's
# default, transport/tcp/send_buffer_tuner.h), 0 (the kernel's autotuning) and fixed sizes. The
# settings alternate within each round, so that a slow phase of the machine hits them alike. One
# JSON line per case: rate, setting, round, bytes, median and p90 ms, and the link's bound (push
# and pull each carry the bytes, one per direction, at the rate) where it is shaped.
#
#   bash bench/send_buffer_bench.sh                  # ~4 minutes; needs root
#   bash bench/send_buffer_bench.sh --rates 200mbit  # ~10 minutes: 64 MB takes 3 s a pushpull
#   bash bench/send_buffer_bench.sh --rates 1gbit --sndbufs "auto 32768" --rounds 1
#
# --build DIR (relative to the repository, or absolute; build) holds dtrain and kvstore_bench;
# --job-timeout S (600) bounds each job's processes; --bytes and --seconds go to kvstore_bench.
#
# Everything it starts runs inside the two namespaces, which are deleted (with whatever still
# runs there) on every exit path, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
rates="none 1gbit"
sndbufs="auto 0 32768"
bytes=1048576,16777216,67108864
rounds=2
seconds=2
job_timeout=600
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --sndbufs) sndbufs=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --job-timeout) job_timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "send_buffer_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "send_buffer_bench: needs root for ip netns and tc (skipped)" >&2; exit 77; }
[[ $build == /* ]] || build=$PWD/$build
dtrain=$build/src/tools/dtrain
bench=$build/bench/kvstore_bench
for bin in "$dtrain" "$bench"; do
  [[ -x $bin ]] || { echo "send_buffer_bench: $bin is missing: bash scripts/build.sh" >&2; exit 2; }
done

source "scripts/netns.sh"
make_host_pair sb 76 send_buffer_bench ||
  { echo "send_buffer_bench: cannot make network namespaces joined by a veth pair here" >&2; exit 1; }

in_ns() {  # NS HOST ROLE LOG CMD...: a job process in namespace NS, in the background
  local ns=$1 host=$2 role=$3 log=$4
  shift 4
  ip netns exec "$ns" env "${job_env[@]}" DMLC_ROLE="$role" DMLC_NODE_HOST="$host" \
    OMP_NUM_THREADS=1 timeout "$job_timeout" "$@" >"$log" 2>&1 &
}

for rate in $rates; do
  shape_host_pair "$rate"
  for ((round = 1; round <= rounds; round++)); do
    for sndbuf in $sndbufs; do
      job_env=(DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$((20000 + RANDOM % 20000))
               DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DTRAIN_TCP_SNDBUF=$sndbuf)
      in_ns "$a" "$addr_a" scheduler "$logs/sched.log" "$dtrain" scheduler; p1=$!
      in_ns "$a" "$addr_a" server "$logs/server.log" "$dtrain" server; p2=$!
      in_ns "$b" "$addr_b" worker "$logs/worker.log" "$bench" --ops pushpull --bytes "$bytes" \
        --seconds "$seconds"; p3=$!
      rc=0
      for pid in "$p3" "$p1" "$p2"; do wait "$pid" || rc=1; done
      ((rc == 0)) || { echo "send_buffer_bench: job failed:" >&2; tail "$logs"/*.log >&2; exit 1; }
      grep '^{' "$logs/worker.log" | python3 -c '
import json, sys
rate, sndbuf, rnd, mbit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
for line in sys.stdin:
    d = json.loads(line)
    bound = d["bytes"] * 8 / (mbit * 1e6) * 1e3 if mbit else None
    print(json.dumps({"bench": "send_buffer", "rate": rate, "tcp_sndbuf": sndbuf, "round": rnd,
                      "bytes": d["bytes"], "median_ms": round(d["median_ms"], 3),
                      "p90_ms": round(d["p90_ms"], 3),
                      "link_bound_ms": None if bound is None else round(bound, 3)}))
' "$rate" "$sndbuf" "$round" "$(link_mbit "$rate")"
    done
  done
done
