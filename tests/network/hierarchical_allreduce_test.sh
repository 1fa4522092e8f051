#!/usr/bin/env bash
# Allreduce mode with two ranks on each of two emulated hosts (network namespaces A and B joined by
# a veth pair): ranks 0 and 1 on A, 2 and 3 on B, over Gloo (more-hosts adds two hosts of one rank).
# The ranks of a host share memory and the hosts' leaders (ranks 0 and 2) run Gloo among themselves
# (src/collectives/gloo/host_groups.h): allreduce, allgather, broadcast and barrier each go within a
# host, between the leaders, and back.
#
#   hierarchical_allreduce_test.sh CASE BUILD_DIR
#
# CASE:
#   exact          collectives_check's exact scenario (allreduces up to 4 MB, allgathers,
#                  broadcasts, every dtype): every rank exact, every rank says it is hierarchical.
#   interleaved    the same with ranks 0 and 2 on A, 1 and 3 on B: allgathers still in rank order.
#   tcp            the same with DTRAIN_GLOO_SHM=0: exact, and no rank is hierarchical.
#   killed-leader  rank 2 (B's leader) killed mid-run: ranks 0, 1 and 3 fail promptly, naming it.
#   killed-member  rank 3 (not a leader) killed mid-run: ranks 0, 1 and 2 fail promptly, naming it.
#   more-hosts     exact with ranks 4 and 5 each on a host of its own (A's network, each in a pid
#                  namespace of its own: host ids count the pid namespace): four hosts, two of one
#                  rank, so four leaders, whose small allgathers (the negotiation rounds) go to
#                  every peer at once rather than around gloo's ring.
#
# Exit 77 (skipped) where namespaces cannot be made. Everything runs inside the two namespaces,
# which are deleted (with what runs there) on every exit path.
set -euo pipefail

case_name=$1
build=$2
check=$build/tests/collectives_check

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "needs iproute2 (ip)"

source "$(dirname "$0")/../../scripts/netns.sh"
make_host_pair ha 79 hierarchical ||
  skip "cannot create network namespaces joined by a veth pair here"

port=$((20000 + $$ % 20000))
args=(--scenario exact --max-elements 1048576)
extra_env=()
victim=""
ranks=4 hosts=2
case $case_name in
  exact | interleaved) ;;
  more-hosts) ranks=6 hosts=4 ;;
  tcp) extra_env=(DTRAIN_GLOO_SHM=0) ;;
  killed-leader) args=(--scenario die --pid-dir "$logs"); victim=2 ;;
  killed-member) args=(--scenario die --pid-dir "$logs"); victim=3 ;;
  *) echo "unknown case $case_name" >&2; exit 2 ;;
esac

pids=()
for ((rank = 0; rank < ranks; rank++)); do
  on_a=$((rank < 2 || rank >= 4))
  [[ $case_name == interleaved ]] && on_a=$((rank % 2 == 0))
  if ((on_a)); then ns=$a host=$addr_a; else ns=$b host=$addr_b; fi
  own_pids=()
  ((rank >= 4)) && own_pids=(unshare --pid --fork)
  ip netns exec "$ns" "${own_pids[@]}" env DTRAIN_COLLECTIVES=gloo DTRAIN_NODE_RANK=$rank \
    DMLC_NUM_WORKER=$ranks DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$port DMLC_NODE_HOST=$host \
    PS_VERBOSE=1 "${extra_env[@]}" timeout 120 "$check" "${args[@]}" >"$logs/rank$rank.log" 2>&1 &
  pids+=($!)
done

fail() {
  echo "FAIL: $*"
  for ((rank = 0; rank < ranks; rank++)); do echo "--- rank $rank"; tail -20 "$logs/rank$rank.log"; done
  exit 1
}

if [[ -n $victim ]]; then
  for ((i = 0; i < 600; i++)); do
    [[ -s $logs/rank$victim.pid ]] && grep -q "step 100" "$logs/rank$victim.log" && break
    sleep 0.1
  done
  [[ -s $logs/rank$victim.pid ]] || fail "rank $victim never got going"
  killed_at=$(date +%s.%N)
  kill -9 "$(cat "$logs/rank$victim.pid")"
fi

codes=()
for ((rank = 0; rank < ranks; rank++)); do
  code=0
  wait "${pids[$rank]}" || code=$?
  codes+=("$code")
done
ended_at=$(date +%s.%N)

case $case_name in
  exact | interleaved | tcp | more-hosts)
    for ((rank = 0; rank < ranks; rank++)); do
      [[ ${codes[$rank]} -eq 0 ]] || fail "rank $rank exited ${codes[$rank]}"
      grep -q "\[rank $rank\] exact OK" "$logs/rank$rank.log" || fail "rank $rank not exact"
      if [[ $case_name != tcp ]]; then
        grep -q "hierarchical allreduce over $hosts hosts" "$logs/rank$rank.log" ||
          fail "rank $rank not hierarchical over $hosts hosts"
      elif grep -q "hierarchical allreduce\|shared memory among" "$logs/rank$rank.log"; then
        fail "rank $rank shares memory with DTRAIN_GLOO_SHM=0"
      fi
    done
    echo "{\"test\":\"hierarchical_allreduce\",\"case\":\"$case_name\",\"ranks\":$ranks,\"hosts\":$hosts}"
    ;;
  killed-*)
    for ((rank = 0; rank < ranks; rank++)); do
      [[ $rank == "$victim" ]] && continue
      [[ ${codes[$rank]} -eq 3 ]] || fail "rank $rank exited ${codes[$rank]}, not with a peer error"
      grep -q "rank $victim (" "$logs/rank$rank.log" || fail "rank $rank does not name rank $victim"
    done
    seconds=$(awk -v a="$killed_at" -v b="$ended_at" 'BEGIN { printf "%.1f", b - a }')
    # Promptly: the others' waits look at their peers every 100 ms and gloo's at once; far below
    # the 120 s limit and the 600 s collective timeout.
    awk -v s="$seconds" 'BEGIN { exit !(s < 20) }' || fail "the others took $seconds s to fail"
    echo "{\"test\":\"hierarchical_allreduce\",\"case\":\"$case_name\",\"fail_s\":$seconds}"
    ;;
esac
