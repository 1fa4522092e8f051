# Shell functions for emulated hosts (network namespaces), sourced by the benchmarks and tests that
# build them (bench/compression_bench.sh, tests/network/link_faults_test.sh).

# delete_netns NS...: kills whatever still runs in each namespace, then deletes it. Never fails.
delete_netns() {
  local ns
  for ns in "$@"; do
    if grep -q "^$ns\b" <<<"$(ip netns list 2>/dev/null)"; then  # not piped: under pipefail, grep -q stopping early can fail the pipe
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}
