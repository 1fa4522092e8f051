# Shell functions for emulated hosts (network namespaces), sourced by the benchmarks and tests that
# build them (bench/compression_bench.sh, tests/network/link_faults_test.sh).

# delete_netns NS...: kills whatever still runs in each namespace, then deletes it. Never fails.
delete_netns() {
  local ns
  for ns in "$@"; do
    # Not piped: under pipefail, grep -q stopping at its match can fail the pipe (SIGPIPE).
    if grep -q "^$ns\b" <<<"$(ip netns list 2>/dev/null)"; then
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      # SIGKILL is asynchronous: wait (up to 5 s) until they are gone, so that nothing of the
      # namespace outlives this call.
      local i
      for ((i = 0; i < 50; i++)); do
        [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
        sleep 0.1
      done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}
