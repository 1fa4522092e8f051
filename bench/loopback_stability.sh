#!/usr/bin/env bash
# Run-to-run stability of pushpull over plain TCP on one host (DTRAIN_SAME_HOST=0), 1x1 and 2x2,
# against what the machine gives a bare TCP echo at the same moments (bench/loopback_echo.cc).
#
# Each round runs the probe, a 1x1 job, the probe, a 2x2 job and the probe, each job timing
# pushpull of 1 MB and 16 MB for about a second (kvstore_bench). A virtual machine's cores are not
# always as fast: when the probe on either side of a job is over --slow times the fastest probe of
# the run, the job ran on a slowed machine and is counted apart. Prints one JSON line per job and
# probe, then per layout and size a summary line: the medians' range over the rounds on a normal
# machine and over all rounds, the worst p90 / median, and ps-lite's median there.
#
#   bash bench/loopback_stability.sh                  # 12 rounds
#   bash bench/loopback_stability.sh --rounds 4 --slow 1.3 --build build
#   DTRAIN_TCP_LOCAL_CONGESTION=system bash bench/loopback_stability.sh   # the kernel's default
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=12 slow=1.25 seconds=1 build=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--slow RATIO] [--seconds S] [--build DIR]" >&2; exit 2 ;;
  esac
done
for bin in "$build/bench/kvstore_bench" "$build/bench/loopback_echo" "$build/src/tools/dtrain"; do
  [[ -x $bin ]] || { echo "loopback_stability: $bin is missing: bash scripts/build.sh" >&2; exit 2; }
done

# The probe's connection uses the congestion control dtrain's connections within a host use.
congestion=${DTRAIN_TCP_LOCAL_CONGESTION:-cubic}
[[ $congestion == system ]] && congestion=""
out=$(mktemp)
trap 'rm -f "$out"' EXIT
probe() {  # round
  "$build/bench/loopback_echo" --seconds "$seconds" --congestion "$congestion" |
    sed "s/^{/{\"round\":$1,/" | tee -a "$out"
}
job() {  # round workers servers
  DTRAIN_SAME_HOST=0 "$build/src/tools/dtrain" launch -n "$2" -s "$3" --launcher local --no-summary -- \
    "$build/bench/kvstore_bench" --ops pushpull --bytes 1048576,16777216 --seconds "$seconds" |
    sed -n "s/^\[worker 0\] {/{\"round\":$1,/p" | tee -a "$out"
}
for ((r = 1; r <= rounds; r++)); do
  probe "$r"
  job "$r" 1 1
  probe "$r"
  job "$r" 2 2
  probe "$r"
done

python3 - "$out" "$slow" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
slow = float(sys.argv[2])
# In file order a job sits between two probes; a job is on a normal machine when both are fast.
fastest = min(l["median_ms"] for l in lines if "probe" in l)
cases = {}
for i, l in enumerate(lines):
    if "probe" in l:
        continue
    around = [lines[j]["median_ms"] for j in (i - 1, i + 1)
              if 0 <= j < len(lines) and "probe" in lines[j]]
    normal = all(ms <= slow * fastest for ms in around)
    cases.setdefault((l["workers"], l["servers"], l["bytes"]), []).append((normal, l))
for (w, s, b), runs in sorted(cases.items()):
    def spread(sel):
        meds = [l["median_ms"] for _, l in sel]
        return {"median_ms_min": min(meds), "median_ms_max": max(meds),
                "max_over_min": max(meds) / min(meds),
                "worst_p90_over_median": max(l["p90_ms"] / l["median_ms"] for _, l in sel)}
    normal = [x for x in runs if x[0]]
    summary = {"summary": "loopback_stability", "workers": w, "servers": s, "bytes": b,
               "rounds": len(runs), "rounds_on_normal_machine": len(normal),
               "probe_fastest_ms": fastest, "slow_probe_ratio": slow,
               "pslite_median_ms": runs[0][1].get("pslite_median_ms"),
               "congestion": next(l["congestion"] for l in lines if "probe" in l),
               "all_rounds": spread(runs)}
    if normal:
        summary["normal_rounds"] = spread(normal)
    print(json.dumps(summary))
EOF
