#!/usr/bin/env bash
# bench/cluster_bench.sh end to end on a tiny case, then bench/plot_cluster.py on what it printed:
# two namespace hosts with sshd, the wire probe, dist_sync and horovod over Gloo with 1 and 2
# workers on LeNet's shapes; every line must be there with sane numbers, and the plot a PNG.
# Skipped (77) where namespaces cannot be made (not root). Usage: cluster_bench_test.sh BUILD_DIR
set -euo pipefail
build=$1
cd "$(dirname "$0")/../.."
[[ $(id -u) -eq 0 ]] || { echo "needs root for ip netns"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 300 bash bench/cluster_bench.sh --build "$build" --workers "1 2" \
  --modes "wire dist_sync_colocated horovod_gloo" --model lenet --compute-ms 20 --steps 2 \
  --link-mbit 200 >"$out/results.jsonl"
cat "$out/results.jsonl"
python3 - "$out/results.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cases = {(d["case"], d["workers"]) for d in lines}
want = {("wire", 2), ("dist_sync_colocated", 1), ("dist_sync_colocated", 2),
        ("horovod_gloo", 1), ("horovod_gloo", 2)}
assert cases == want, cases
for d in lines:
    if d["case"] == "wire":
        assert 0.5 < d["link_efficiency"] <= 1.05, d
    else:
        assert d["step_ms"] >= 20 and 0 < d["efficiency"] <= 1.01 and d["bound_ms"] >= 20, d
PY
python3 bench/plot_cluster.py "$out/results.jsonl" -o "$out/cluster.png"
python3 - "$out/cluster.png" <<'PY'
import sys
header = open(sys.argv[1], "rb").read(24)
assert header[:8] == b"\x89PNG\r\n\x1a\n", header
width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
assert width >= 800 and height >= 600, (width, height)
print("cluster_bench_test: OK", width, "x", height)
PY
