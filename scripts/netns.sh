# Shell functions for emulated hosts (network namespaces), sourced by the benchmarks and tests that
# build a pair of them (bench/compression_bench.sh, bench/send_buffer_bench.sh,
# bench/hierarchical_bench.sh, tests/network/link_faults_test.sh,
# tests/network/hierarchical_allreduce_test.sh, tests/network/pod_start_order_test.sh):
# make_host_pair, then shape_host_pair.

# delete_netns NS...: kills whatever still runs in each namespace, then deletes it and its
# /etc/netns/NS (the files `ip netns exec` mounts over /etc there, which a test may have written).
# Never fails.
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
    [[ -z $ns ]] || rm -rf "/etc/netns/$ns"
  done
}

# join_netns_pair NS_A NS_B VETH_A VETH_B ADDR_A ADDR_B: two emulated hosts, namespaces NS_A and
# NS_B joined by a veth pair (VETH_A in NS_A with ADDR_A/24, VETH_B in NS_B with ADDR_B/24), every
# link up. Returns non-zero at the first step this machine refuses, so that a test can skip.
join_netns_pair() {
  local a=$1 b=$2 veth_a=$3 veth_b=$4 addr_a=$5 addr_b=$6
  ip netns add "$a" 2>/dev/null && ip netns add "$b" &&
    ip link add "$veth_a" netns "$a" type veth peer name "$veth_b" netns "$b" || return 1
  # Chained: under a caller's `||`, set -e does not stop at a failing step.
  ip -n "$a" addr add "$addr_a/24" dev "$veth_a" && ip -n "$b" addr add "$addr_b/24" dev "$veth_b" &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
    ip -n "$a" link set "$veth_a" up && ip -n "$b" link set "$veth_b" up
}

# shape_link NS DEV RATE: DEV's egress in NS through tc's token bucket at RATE (tc's units: 1gbit,
# 100mbit), 256 KB of burst and 100 ms of queue; RATE none removes the shaping.
shape_link() {
  if [[ $3 == none ]]; then
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true
  else
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 256kb latency 100ms
  fi
}

# link_mbit RATE: a shape_link RATE in Mbit/s (1gbit: 1000, 200mbit: 200); none (unshaped): 0.
link_mbit() { case $1 in *gbit) echo $((${1%gbit} * 1000)) ;; *mbit) echo "${1%mbit}" ;; *) echo 0 ;; esac; }

# delete_on_exit NS_A NS_B DIR: on every exit path of the calling script, Ctrl-C included, deletes
# the two namespaces (with what runs there) and DIR.
delete_on_exit() {
  # The cleanup ignores a second signal (a group's Ctrl-C reaches us twice), which must not cut it
  # short.
  trap "trap '' INT TERM; delete_netns ${1@Q} ${2@Q}; rm -rf ${3@Q}" EXIT
  trap 'exit 130' INT TERM
}

# make_host_pair TAG NET NAME: two emulated hosts joined by a veth pair, deleted with a scratch
# directory on every exit path of the calling script (delete_on_exit). TAG (two letters) keeps the
# names of concurrent users apart, NET their subnet. Sets, for the caller:
#   a, b            the namespaces: dtrain-TAG-a-PID and dtrain-TAG-b-PID
#   veth_a, veth_b  their ends of the veth pair: vTAGaPID in a, vTAGbPID in b
#   addr_a, addr_b  10.254.NET.1 and 10.254.NET.2
#   logs            a new directory, /tmp/NAME.XXXXXX
# Returns non-zero where this machine cannot make them (join_netns_pair), so that a test can skip.
make_host_pair() {
  a=dtrain-$1-a-$$ b=dtrain-$1-b-$$
  veth_a=v$1a$$ veth_b=v$1b$$
  addr_a=10.254.$2.1 addr_b=10.254.$2.2
  logs=$(mktemp -d "/tmp/$3.XXXXXX")
  delete_on_exit "$a" "$b" "$logs"
  join_netns_pair "$a" "$b" "$veth_a" "$veth_b" "$addr_a" "$addr_b"
}

# shape_host_pair RATE: both directions of make_host_pair's link at RATE (shape_link's units).
shape_host_pair() { shape_link "$a" "$veth_a" "$1" && shape_link "$b" "$veth_b" "$1"; }

# wait_for_named_pids: waits for each process in the caller's `pids` array and sets `codes` to
# NAME=EXIT_CODE for each (names from the caller's `names` array), in the same order.
wait_for_named_pids() {
  codes=()
  local i code
  for i in "${!pids[@]}"; do
    code=0
    wait "${pids[$i]}" || code=$?
    codes+=("${names[$i]}=$code")
  done
}
