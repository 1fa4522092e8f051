#!/usr/bin/env bash
# KVStore push/pull/pushpull latency and throughput for 4 KB .. 64 MB, started through
# `dtrain launch`, for 1 worker x 1 server and 2 workers x 2 servers, over plain TCP and with the
# same-host fast path. Prints one JSON line per case; pushpull lines carry the ps-lite reference
# time and our ratio to it.
#
#   bash bench/kvstore_bench.sh                 # both layouts, both transports
#   bash bench/kvstore_bench.sh 4 2             # one layout: 4 workers, 2 servers
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bench/kvstore_bench ]] || bash scripts/build.sh
layouts=("1 1" "2 2")
if [[ $# -ge 2 && $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ ]]; then layouts=("$1 $2"); shift 2; fi
for layout in "${layouts[@]}"; do
  read -r n s <<<"$layout"
  for same_host in 0 1; do
    DTRAIN_SAME_HOST=$same_host build/src/tools/dtrain launch -n "$n" -s "$s" --launcher local -- \
      build/bench/kvstore_bench "$@" | sed -n 's/^\[worker 0\] //p'
  done
done
