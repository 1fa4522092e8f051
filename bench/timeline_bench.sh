#!/usr/bin/env bash
# What the timeline (DTRAIN_TIMELINE) costs: dtrain-train, 2 workers and 2 servers on this machine
# (dtrain launch), with and without the timeline, alternated --repeat times; samples/s summed over
# the workers (each worker's median progress window after the first), best of the repeats.
# Prints one JSON line per network with both figures and the cost in percent of step time, after
# two lines from timeline_span_bench: what one span costs the recording thread, off and on.
#
#   bash bench/timeline_bench.sh                      # LeNet and the MLP, ~2 minutes
#   bash bench/timeline_bench.sh --networks lenet --repeat 5 --batch 16
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
networks="lenet mlp"
repeat=3
batch=64
samples=20000
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --networks) networks=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "timeline_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
logs=$(mktemp -d /tmp/timeline_bench.XXXXXX)
trap 'rm -rf "$logs"' EXIT
speed() {
  python3 -c '
import re, statistics, sys
per = {}
for line in open(sys.argv[1]):
    m = re.match(r"\[worker (\d+)\].*Speed: ([0-9.]+) samples/sec", line)
    if m:
        per.setdefault(m.group(1), []).append(float(m.group(2)))
print("%.1f" % sum(statistics.median(v[1:]) for v in per.values() if len(v) > 1))' "$1"
}
run() {  # NETWORK on|off -> samples/s
  local tl=()
  [[ $2 == on ]] && tl=(env DTRAIN_TIMELINE="$logs/trace.json")
  "${tl[@]}" "$build/src/tools/dtrain" launch -n 2 -s 2 -- "$build/src/train/dtrain-train" \
    --dataset fashion-mnist --network "$1" --epochs 1 --batch-size "$batch" \
    --limit-train "$samples" --disp-batches 20 --optimizer sgd --lr 0.05 --threads 1 \
    >"$logs/run.log" 2>&1 || { tail "$logs/run.log" >&2; exit 1; }
  speed "$logs/run.log"
}
"$build/bench/timeline_span_bench"
DTRAIN_TIMELINE="$logs/span.json" "$build/bench/timeline_span_bench"
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }
for net in $networks; do
  on=0; off=0
  for ((r = 1; r <= repeat; r++)); do
    off=$(best "$off" "$(run "$net" off)")
    on=$(best "$on" "$(run "$net" on)")
  done
  events=$(python3 -c 'import json,sys; print(sum(1 for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"))' "$logs/trace.json")
  printf '{"bench":"timeline_cost","network":"%s","batch":%d,"samples":%d,"samples_per_s_off":%s,"samples_per_s_on":%s,"cost_percent":%s,"events":%s,"repeat":%d}\n' \
    "$net" "$batch" "$samples" "$off" "$on" \
    "$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", (a - b) / a * 100 }')" "$events" "$repeat"
done
