#!/usr/bin/env bash
# Allreduce mode with several ranks on each of two emulated hosts (network namespaces joined by a
# veth pair, each side shaped with tc to --rate): dtrain's hierarchical collectives (shared memory
# within a host, gloo between the hosts' leaders; src/collectives/gloo/host_groups.h) against every
# rank on gloo's TCP (DTRAIN_GLOO_SHM=0), alternated, in one run. Each run is
# bench/allreduce_bench's "plain" (the communicator called directly) and "engine" (submit by
# name, negotiate, fuse) phases, float32, median per allreduce, from rank 0.
#
#   bash bench/hierarchical_bench.sh                        # 2 hosts x 2 ranks, 1 Gbit/s
#   bash bench/hierarchical_bench.sh --rate none --ranks-per-host 2 --max-mb 16 --repeats 2
#
# Prints one JSON line per size, phase and path, then a table with each size's ratio and the
# link's floor for the leaders' allreduce (2 hosts: each leader sends the whole tensor once,
# bytes / rate). Needs root (ip netns, tc) and the project built (BUILD_DIR, default ./build).
set -euo pipefail
cd "$(dirname "$0")/.."

rate=1gbit
per_host=2
max_mb=16
repeats=2
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    --max-mb) max_mb=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hierarchical_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
bench=$PWD/${BUILD_DIR:-build}/bench/allreduce_bench
[[ -x $bench ]] || { echo "hierarchical_bench: $bench is missing: build first" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "hierarchical_bench: needs root (ip netns, tc)" >&2; exit 2; }

source scripts/netns.sh
make_host_pair hb 81 hierarchical_bench
shape_host_pair "$rate"

ranks=$((2 * per_host))
results=$logs/results.jsonl
run() {  # LABEL ENV...: one job, rank r on host a for r < per_host
  local label=$1 pids=() rank ns host port
  shift
  port=$((20000 + RANDOM % 20000))
  for ((rank = 0; rank < ranks; rank++)); do
    if ((rank < per_host)); then ns=$a host=$addr_a; else ns=$b host=$addr_b; fi
    ip netns exec "$ns" env DTRAIN_COLLECTIVES=gloo DTRAIN_NODE_RANK=$rank DMLC_NUM_WORKER=$ranks \
      DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$port DMLC_NODE_HOST=$host "$@" \
      timeout 600 "$bench" --phases plain engine --min-kb 64 --max-mb "$max_mb" --repeats 1 \
      --seconds-per-case 1 --label "$label" >"$logs/$label.$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  grep '^{' "$logs/$label.0.log" | tee -a "$results"
}
for ((i = 0; i < repeats; i++)); do
  run hierarchical
  run tcp DTRAIN_GLOO_SHM=0
done

python3 - "$results" "$(link_mbit "$rate")" "$per_host" <<'EOF'
import json, statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    j = json.loads(line)
    rows[(j["bytes"], j["impl"], j["label"])].append(j["median_us"] / 1000)
mbit = float(sys.argv[2])
print(f"\n2 hosts x {sys.argv[3]} ranks, link {mbit:g} Mbit/s (0: unshaped); median ms over runs")
print("size     | phase  | hierarchical | tcp      | tcp / hierarchical | link floor")
for size in sorted({k[0] for k in rows}):
    for impl in ("plain", "engine"):
        h, t = rows.get((size, impl, "hierarchical")), rows.get((size, impl, "tcp"))
        if not h or not t:
            continue
        h, t = statistics.median(h), statistics.median(t)
        floor = f"{size * 8 / (mbit * 1e3):.2f}" if mbit else "-"
        print(f"{size // 1024:>5} KB | {impl:<6} | {h:>12.2f} | {t:>8.2f} | {t / h:>18.2f} | {floor}")
EOF
